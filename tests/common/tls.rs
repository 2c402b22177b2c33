//! Certificates for tests that serve HTTPS: a CA made on the spot (rcgen) and leaf
//! certificates for 127.0.0.1 and localhost signed by it; and [`HttpsFiles`], Python's
//! `http.server` serving a folder behind TLS with such a certificate.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A new CA called `name`: its certificate and the issuer that signs with it.
pub fn ca(name: &str) -> (rcgen::Certificate, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).unwrap();
    (cert, Issuer::new(params, key))
}

/// A server certificate for 127.0.0.1 and localhost signed by `issuer` (expired in 2021 when
/// `expired`), and its key.
pub fn leaf(issuer: &Issuer<'static, KeyPair>, expired: bool) -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "iota test server");
    if expired {
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    }
    (params.signed_by(&key, issuer).unwrap(), key)
}

/// Python's `http.server` behind TLS, serving a folder on a free loopback port with a
/// certificate of a CA made for it; killed on drop.
pub struct HttpsFiles {
    child: std::process::Child,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The CA's certificate (PEM), for `--ca-file`.
    pub ca_pem: std::path::PathBuf,
}

impl HttpsFiles {
    /// Serves `root`, with the CA and the server's certificate and key written under `pki`.
    pub fn start(root: &std::path::Path, pki: &std::path::Path) -> Self {
        let (ca_cert, issuer) = ca("iota data test CA");
        let (leaf, leaf_key) = leaf(&issuer, false);
        std::fs::create_dir_all(pki).unwrap();
        let (ca_pem, cert, key) = (
            pki.join("ca.pem"),
            pki.join("cert.pem"),
            pki.join("key.pem"),
        );
        std::fs::write(&ca_pem, ca_cert.pem()).unwrap();
        std::fs::write(&cert, leaf.pem()).unwrap();
        std::fs::write(&key, leaf_key.serialize_pem()).unwrap();
        let script = "import functools, http.server, ssl, sys\n\
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n\
            ctx.load_cert_chain(sys.argv[2], sys.argv[3])\n\
            handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])\n\
            server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)\n\
            server.socket = ctx.wrap_socket(server.socket, server_side=True)\n\
            print(server.server_address[1], flush=True)\n\
            server.serve_forever()\n";
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(root)
            .arg(&cert)
            .arg(&key)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 for the HTTPS server");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let port: u16 = line.trim().parse().expect("the server's port");
        Self {
            child,
            url: format!("https://127.0.0.1:{port}"),
            ca_pem,
        }
    }
}

impl Drop for HttpsFiles {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
