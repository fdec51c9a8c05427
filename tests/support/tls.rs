//! TLS for the tests: a throwaway CA and a server certificate for 127.0.0.1 made with `openssl`
//! at test time, and a `redis-server` that also listens with TLS on a port of its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use super::{free_port, RedisServer};

/// A CA and a certificate it signed for `127.0.0.1` and `localhost`, in a directory of their own.
pub struct TestCa {
    pub dir: PathBuf,
}

impl TestCa {
    /// Makes a new CA named `name`, and a server certificate signed by it, under `dir`.
    pub fn new(name: &str) -> TestCa {
        let dir = std::env::temp_dir().join(format!("idem-tls-{}-{name}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        openssl(
            &dir,
            &[&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2"]].concat(),
            &format!("/CN={name}"),
        );
        openssl(&dir, &[&["req"][..], &ec, &["-keyout", "server.key", "-out", "server.csr"]].concat(), "/CN=localhost");
        std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
            .unwrap();
        let out = Command::new("openssl")
            .current_dir(&dir)
            .args(["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"])
            .args(["-out", "server.crt", "-days", "2", "-extfile", "ext.cnf"])
            .output()
            .expect("openssl (Debian's openssl package) is needed for the TLS tests");
        assert!(out.status.success(), "openssl x509: {}", String::from_utf8_lossy(&out.stderr));
        TestCa { dir }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str], subject: &str) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .args(["-subj", subject])
        .output()
        .expect("openssl (Debian's openssl package) is needed for the TLS tests");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A `redis-server` with its plaintext port (for the harness and for `CLIENT LIST`) and a TLS
/// port serving `ca`'s server certificate.
pub struct TlsRedis {
    pub server: RedisServer,
    pub tls_port: u16,
}

impl TlsRedis {
    pub fn start(ca: &TestCa) -> TlsRedis {
        Self::start_with(ca, &[])
    }

    /// A server with more options (`--cluster-enabled yes`, ...).
    pub fn start_with(ca: &TestCa, extra: &[&str]) -> TlsRedis {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let tls_port = Arc::new(AtomicU16::new(0));
        let (port_out, cert, key, ca_file) =
            (tls_port.clone(), ca.file("server.crt"), ca.file("server.key"), ca.file("ca.crt"));
        let server = RedisServer::start_with(Arc::new(move |_, _| {
            let port = free_port();
            port_out.store(port, Ordering::SeqCst);
            let trailing = [
                "--tls-port",
                &port.to_string(),
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &ca_file,
                "--tls-auth-clients",
                "no",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain(extra.iter().cloned())
            .collect();
            (Vec::new(), trailing)
        }));
        TlsRedis { tls_port: tls_port.load(Ordering::SeqCst), server }
    }

    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }
}
