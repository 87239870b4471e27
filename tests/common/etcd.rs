//! A real etcd server (Debian's `etcd-server`) for cluster tests, on free
//! loopback ports with its own data directory, killed when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use strata::cluster::{ClusterUrl, Etcd, TopicStore};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
const SOON: Duration = Duration::from_secs(10);

pub struct EtcdServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub client_port: u16,
    peer_port: u16,
}

impl EtcdServer {
    /// `None` (with the reason printed) when there is no etcd to run.
    pub fn start() -> Option<EtcdServer> {
        if Command::new("etcd").arg("--version").output().is_err() {
            eprintln!("skipping: no `etcd` binary on PATH (Debian package etcd-server)");
            return None;
        }
        let [client_port, peer_port] = free_ports();
        let mut server = EtcdServer {
            child: None,
            dir: tempfile::tempdir().unwrap(),
            client_port,
            peer_port,
        };
        server.spawn();
        Some(server)
    }

    pub fn spawn(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .unwrap();
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("default={peer}")])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self) -> ClusterUrl {
        format!("etcd://127.0.0.1:{}/test", self.client_port)
            .parse()
            .unwrap()
    }

    /// Waits until etcd answers requests.
    pub async fn ready(&self) -> Etcd {
        let deadline = Instant::now() + SOON;
        loop {
            if let Ok(etcd) = Etcd::connect(&self.url(), REQUEST_TIMEOUT).await {
                if TopicStore::new(etcd.clone()).list().await.is_ok() {
                    return etcd;
                }
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not come up: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Distinct ports nobody listens on (held together while choosing, so the
/// kernel cannot hand out the same one twice).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().unwrap().port())
}
