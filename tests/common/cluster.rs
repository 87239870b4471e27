//! Brokers in cluster mode for tests: `strata` processes on 127.0.0.1
//! sharing one `file://` object store and a real etcd (lease TTL 2 s, so a
//! lost broker's partitions move within a few seconds).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::etcd::EtcdServer;
use super::{free_port, Process};

pub struct Cluster {
    pub etcd: EtcdServer,
    pub store: tempfile::TempDir,
    pub brokers: BTreeMap<i32, (Process, tempfile::TempDir)>,
}

impl Cluster {
    /// `None` (the test is skipped) when there is no etcd to run.
    pub async fn start(nodes: &[i32]) -> Option<Cluster> {
        let etcd = EtcdServer::start()?;
        etcd.ready().await;
        let mut cluster = Cluster {
            etcd,
            store: tempfile::tempdir().unwrap(),
            brokers: BTreeMap::new(),
        };
        for &node in nodes {
            cluster.start_broker(node);
        }
        Some(cluster)
    }

    pub fn start_broker(&mut self, node: i32) {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("file://{}", self.store.path().display());
        let etcd = self.etcd_url();
        let process = Process::start(
            dir.path(),
            free_port(),
            &[
                "--node-id",
                &node.to_string(),
                "--cluster",
                &etcd,
                "--store",
                &store,
                "--cluster-lease-ttl-ms",
                "2000",
                "--wal-flush-ms",
                "10",
                "--compaction-worker",
                "false",
            ],
        );
        self.brokers.insert(node, (process, dir));
    }

    pub fn etcd_url(&self) -> String {
        format!("etcd://127.0.0.1:{}/strata-test", self.etcd.client_port)
    }

    pub fn bootstrap(&self) -> String {
        self.brokers
            .values()
            .map(|(p, _)| p.bootstrap())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn addr(&self, node: i32) -> SocketAddr {
        self.brokers[&node].0.bootstrap().parse().unwrap()
    }

    pub fn port(&self, node: i32) -> u16 {
        self.brokers[&node].0.port
    }

    /// kill -9 of broker `node`; its data directory stays.
    pub fn kill9(&mut self, node: i32) {
        let (process, _dir) = self.brokers.remove(&node).unwrap();
        process.kill9();
    }
}
