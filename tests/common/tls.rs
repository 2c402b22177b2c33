//! Certificates for tests that serve HTTPS: a CA made on the spot (rcgen) and leaf
//! certificates for 127.0.0.1 and localhost signed by it.

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
