//! Clock, ports, plain-socket GETs and pollers shared by the tests that run real servers.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock time in Unix milliseconds (what signed requests carry).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// A free loopback port for a server the test starts, picked below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`). A port from that range (what binding port 0
/// gives) can be taken, between release and the server's bind, as the source port of any
/// outgoing connection, or even self-connect a readiness probe; ports below it are only ever
/// bound on purpose.
pub fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    for _ in 0..500 {
        let candidate = rand::random_range(10_000..low.max(11_000));
        if std::net::TcpListener::bind(("127.0.0.1", candidate)).is_ok() {
            return candidate;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free loopback port")
        .port()
}

/// A blocking `GET` over a raw TCP socket (the crate's reqwest is async only): the body of a
/// 200 answer (chunked bodies decoded), or `None` when nothing answers or the status is not 200.
pub fn http_get(url: &str) -> Option<String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/')?;
    let mut stream = std::net::TcpStream::connect(host).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.lines().next().is_some_and(|l| l.contains(" 200 ")) {
        return None;
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        loop {
            let (size, after) = rest.split_once("\r\n")?;
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                break;
            }
            out.push_str(after.get(..n)?);
            rest = after.get(n + 2..)?;
        }
        return Some(out);
    }
    Some(body.to_string())
}

/// `GET {url}/api/status` as JSON, or `None` when nothing answers.
pub fn status(url: &str) -> Option<serde_json::Value> {
    serde_json::from_str(&http_get(&format!("{url}/api/status"))?).ok()
}

/// Completed samples in a status document.
pub fn completed(s: &serde_json::Value) -> u64 {
    s["samples"]["completed"].as_u64().unwrap_or(0)
}

/// Polls `ok` every 200 ms; panics naming `what` after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Serves `app` on a free loopback port from a background thread with its own runtime (for
/// blocking tests); returns the address. The server lives as long as the test process.
pub fn serve_in_thread(app: axum::Router) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("free loopback port");
    let addr = listener.local_addr().expect("bound address");
    listener
        .set_nonblocking(true)
        .expect("non-blocking listener");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            axum::serve(listener, app).await.expect("serving");
        });
    });
    addr
}
