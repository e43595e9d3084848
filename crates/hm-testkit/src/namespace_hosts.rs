//! Hosts on one machine for the tests and tools across hosts: each host is a network namespace
//! with a veth pair to a Linux bridge in one more ("switch") namespace, and runs its commands in a
//! UTS namespace of its own named `hm-host-<h>`. Host `h` is 198.18.0.(h+1)/24 (198.18.0.0/15 is
//! set aside for benchmarking network devices). Needs root and iproute2; everything is removed
//! on drop.
//!
//! ```no_run
//! use hm_testkit::namespace_hosts::NamespaceHosts;
//! let hosts = NamespaceHosts::create(4, "x").expect("needs root");
//! let mut command = std::process::Command::new(&hosts.wrapper(2)[0]);
//! command.args(&hosts.wrapper(2)[1..]).arg("hostname"); // prints hm-host-2
//! hosts.cut(2); // host 2's cable pulled at the switch
//! ```

use std::process::Command;

/// Namespace hosts on one bridge, removed on drop.
#[derive(Debug)]
pub struct NamespaceHosts {
    switch: String,
    namespaces: Vec<String>,
    /// Each host's end of its veth pair (inside the host).
    devices: Vec<String>,
    /// The bridge's end of each host's veth pair (inside the switch).
    ports: Vec<String>,
}

/// Runs `program args…`; its stderr on failure.
pub fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{program} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// The command prefix that runs a program in network namespace `namespace`, in a UTS namespace
/// of its own named `hm-host-<h>`: the program and its arguments follow.
pub fn wrapper(namespace: &str, h: usize) -> Vec<String> {
    let hostname = format!("hostname hm-host-{h} && exec \"$@\"");
    [
        "ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c", &hostname, "sh",
    ]
    .map(str::to_string)
    .to_vec()
}

fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args)
}

impl NamespaceHosts {
    /// Makes `count` hosts; `tag` keeps the names of several sets of one process apart.
    pub fn create(count: usize, tag: &str) -> Result<NamespaceHosts, String> {
        let id = format!("{}{tag}", std::process::id() % 100_000);
        let hosts = NamespaceHosts {
            switch: format!("hm{id}sw"),
            namespaces: (0..count).map(|h| format!("hm{id}h{h}")).collect(),
            devices: (0..count).map(|h| format!("hv{id}{h}")).collect(),
            ports: (0..count).map(|h| format!("hp{id}{h}")).collect(),
        };
        let switch = hosts.switch.as_str();
        ip(&["netns", "add", switch])?;
        ip(&["-n", switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", switch, "link", "set", "br0", "up"])?;
        for h in 0..count {
            let (namespace, device, port) =
                (&hosts.namespaces[h], &hosts.devices[h], &hosts.ports[h]);
            let address = format!("{}/24", NamespaceHosts::address(h));
            ip(&["netns", "add", namespace])?;
            ip(&["link", "add", device, "type", "veth", "peer", "name", port])?;
            ip(&["link", "set", device, "netns", namespace])?;
            ip(&["link", "set", port, "netns", switch])?;
            ip(&["-n", switch, "link", "set", port, "master", "br0"])?;
            ip(&["-n", switch, "link", "set", port, "up"])?;
            ip(&["-n", namespace, "addr", "add", &address, "dev", device])?;
            ip(&["-n", namespace, "link", "set", device, "up"])?;
            ip(&["-n", namespace, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    /// How many hosts.
    pub fn count(&self) -> usize {
        self.namespaces.len()
    }

    /// Host `h`'s address on the bridge.
    pub fn address(h: usize) -> String {
        format!("198.18.0.{}", h + 1)
    }

    /// Host `h`'s network device (for `UCX_NET_DEVICES`).
    pub fn device(&self, h: usize) -> &str {
        &self.devices[h]
    }

    /// The command prefix that runs a program on host `h` under its host name: the program
    /// and its arguments follow.
    pub fn wrapper(&self, h: usize) -> Vec<String> {
        wrapper(&self.namespaces[h], h)
    }

    /// Cuts host `h`'s cable at the switch: nothing is closed, nothing arrives any more.
    pub fn cut(&self, h: usize) {
        ip(&["-n", &self.switch, "link", "set", &self.ports[h], "down"])
            .expect("cannot cut a host's link");
    }

    /// Makes host `h`'s link slow (1 Mbit/s through a token bucket that queues up to 400 ms)
    /// and drops 5% of the packets arriving at it.
    pub fn degrade(&self, h: usize) -> Result<(), String> {
        let (namespace, device) = (&self.namespaces[h], &self.devices[h]);
        let shape = [
            "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate", "1mbit",
            "burst", "32kbit", "latency", "400ms",
        ];
        run("tc", &shape)?;
        let drop = [
            "netns",
            "exec",
            namespace,
            "iptables",
            "-A",
            "INPUT",
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            "0.05",
            "-j",
            "DROP",
        ];
        run("ip", &drop)
    }
}

impl Drop for NamespaceHosts {
    fn drop(&mut self) {
        for namespace in self.namespaces.iter().chain([&self.switch]) {
            let _ = Command::new("ip")
                .args(["netns", "del", namespace])
                .output();
        }
    }
}
