//! The real index server and coordinator on loopback, and icctl pointed at them.

#![allow(dead_code, clippy::unwrap_used)]

use std::process::Command;

use ic_e2e::{ServiceProcess, workspace_binary};
use serde_json::Value;

pub struct Fleet {
    pub index: ServiceProcess,
    pub coordinator: ServiceProcess,
    pub grpc: String,
    pub http: String,
    pub coordinator_url: String,
}

pub fn start() -> Fleet {
    start_with(&[])
}

/// With `extra` index-server flags.
pub fn start_with(extra: &[&str]) -> Fleet {
    let mut args = vec!["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut index = ServiceProcess::start(&workspace_binary("ic-index-server"), &args);
    let grpc = index.addr("grpc").to_string();
    let http = index.admin_addr().to_string();
    let mut coordinator = ServiceProcess::start(
        &workspace_binary("ic-coordinator"),
        &["--host", "127.0.0.1", "--port", "0"],
    );
    let coordinator_url = format!("http://{}", coordinator.admin_addr());
    Fleet {
        index,
        coordinator,
        grpc,
        http,
        coordinator_url,
    }
}

impl Fleet {
    /// Runs icctl; returns (success, stdout, stderr).
    pub fn icctl(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_icctl"))
            .args([
                "--index-grpc",
                &self.grpc,
                "--index-http",
                &self.http,
                "--coordinator",
                &self.coordinator_url,
            ])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.icctl(args);
        assert!(ok, "icctl {args:?} failed: {err}");
        out
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all)).unwrap()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.index.stop();
        self.coordinator.stop();
    }
}
