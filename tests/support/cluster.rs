//! A Redis Cluster of the test's own: 3 primaries and 3 replicas on free ports, formed with
//! `redis-cli --cluster create`, with helpers to route a command to a key's node, find which
//! primary holds a key, kill a primary and wait for its replica's promotion.

use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::{command_at, info_field, redis_cli_binary, try_wait_for, wait_for, RedisServer};

/// How long a node may be unreachable before the cluster fails it over (and what the tests'
/// failover times are made of).
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// A node as `CLUSTER NODES` shows it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// The primary's id, for a replica.
    pub primary_id: Option<String>,
    /// Slot ranges, inclusive.
    pub slots: Vec<(u16, u16)>,
}

impl NodeInfo {
    pub fn is_primary(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    pub fn is_failed(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?" || f == "noaddr")
    }

    pub fn holds(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }

    pub fn slot_count(&self) -> usize {
        self.slots.iter().map(|&(a, b)| usize::from(b - a) + 1).sum()
    }
}

/// Parses a `CLUSTER NODES` reply.
pub fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let addr = fields[1].split('@').next()?;
            let port = addr.rsplit(':').next()?.parse().unwrap_or(0);
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(NodeInfo {
                id: fields[0].to_owned(),
                port,
                flags: fields[2].split(',').map(str::to_owned).collect(),
                primary_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            })
        })
        .collect()
}

/// The hash slot of a Redis key (hash tags honoured), as the cluster computes it.
pub fn slot_of(redis_key: &str) -> u16 {
    idempotency::store::redis::fred::util::redis_keyslot(redis_key.as_bytes())
}

/// Six `redis-server --cluster-enabled yes` nodes formed into one cluster.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts six nodes and forms a cluster of 3 primaries with a replica each; returns once
    /// every node says `cluster_state:ok` with all slots covered, every node knows all six, and
    /// every replica is in sync with its primary.
    pub fn start() -> RedisCluster {
        let started = Instant::now();
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::form() {
                Ok(cluster) => {
                    eprintln!(
                        "redis cluster on ports {:?} formed in {:?} (after {} failed tries: {failures:?})",
                        cluster.nodes.iter().map(|n| n.port()).collect::<Vec<_>>(),
                        started.elapsed(),
                        failures.len()
                    );
                    return cluster;
                }
                Err(failure) => {
                    eprintln!("forming a redis cluster failed: {failure}");
                    failures.push(failure);
                }
            }
        }
        panic!("could not form a redis cluster in 3 tries: {failures:#?}");
    }

    /// One try at [`start`](Self::start): six fresh nodes and `redis-cli --cluster create`,
    /// bounded (redis-cli waits for the nodes to agree without a limit of its own). On failure,
    /// the nodes are killed and the error says what each of them saw.
    fn form() -> Result<RedisCluster, String> {
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                RedisServer::start_with(Arc::new(move |_, _| {
                    let bus = super::free_port();
                    let trailing = [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        &NODE_TIMEOUT_MS.to_string(),
                        "--cluster-port",
                        &bus.to_string(),
                        // A replica fails over however stale it is: the tests kill primaries on
                        // purpose and want the promotion, not an outage.
                        "--cluster-replica-validity-factor",
                        "0",
                    ];
                    (Vec::new(), trailing.iter().map(|s| s.to_string()).collect())
                }))
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let cluster = RedisCluster { nodes };
        let what_each_saw = |cluster: &RedisCluster| -> Vec<String> {
            cluster
                .live_ports()
                .iter()
                .map(|&port| format!("{port}: {:?}", command_at(port, &["CLUSTER", "NODES"])))
                .collect()
        };
        let mut create = Command::new(redis_cli_binary());
        create
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = match super::output_within(create, Duration::from_secs(60)) {
            Ok(out) => out,
            Err(e) => {
                return Err(format!("redis-cli --cluster create: {e}; the nodes saw {:#?}", what_each_saw(&cluster)))
            }
        };
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let limit = Duration::from_secs(30);
        let healthy = try_wait_for(limit, || cluster.health_problem().map_or(Ok(()), Err))
            .and_then(|()| try_wait_for(limit, || cluster.replication_problem().map_or(Ok(()), Err)));
        match healthy {
            Ok(()) => Ok(cluster),
            Err(problem) => Err(format!(
                "the cluster formed but is not healthy within {limit:?} ({problem}): the nodes saw {:#?}",
                what_each_saw(&cluster)
            )),
        }
    }

    /// The cluster shared by the tests of this binary (started on first use; never killed
    /// into: tests that kill nodes start their own).
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(RedisCluster::start)
    }

    /// fred's URL of the cluster, listing every node still running.
    pub fn url(&self) -> String {
        let mut ports = self.nodes.iter().filter(|n| n.is_running()).map(|n| n.port());
        let first = ports.next().expect("no node running");
        let rest: Vec<String> = ports.map(|p| format!("node=127.0.0.1:{p}")).collect();
        format!("redis-cluster://127.0.0.1:{first}?{}", rest.join("&"))
    }

    /// Ports of the nodes still running.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes.iter().filter(|n| n.is_running()).map(|n| n.port()).collect()
    }

    /// The cluster's layout as a live node sees it.
    pub fn layout(&self) -> Vec<NodeInfo> {
        for port in self.live_ports() {
            if let Ok(text) = command_at(port, &["CLUSTER", "NODES"]) {
                return parse_nodes(&text);
            }
        }
        panic!("no live node answers CLUSTER NODES");
    }

    /// Ports of the primaries serving slots (as a live node sees it).
    pub fn primaries(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .layout()
            .iter()
            .filter(|n| n.is_primary() && !n.is_failed() && !n.slots.is_empty())
            .map(|n| n.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The port of the primary serving `slot`.
    pub fn primary_for_slot(&self, slot: u16) -> u16 {
        self.layout()
            .iter()
            .find(|n| n.is_primary() && !n.is_failed() && n.holds(slot))
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no primary serves slot {slot}"))
    }

    /// The port of the primary holding a Redis key.
    pub fn primary_for_key(&self, redis_key: &str) -> u16 {
        self.primary_for_slot(slot_of(redis_key))
    }

    /// The node listening on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes.iter().find(|n| n.port() == port).unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// The port of the replica of the primary on `primary`.
    pub fn replica_of(&self, primary: u16) -> u16 {
        self.try_replica_of(primary).unwrap_or_else(|| panic!("primary {primary} has no replica"))
    }

    /// The port of a live replica of the primary on `primary`, if it has one now (after a
    /// failover, the old primary is its replica only once it has rejoined).
    pub fn try_replica_of(&self, primary: u16) -> Option<u16> {
        let layout = self.layout();
        let id = &layout.iter().find(|n| n.port == primary)?.id;
        layout.iter().find(|n| n.primary_id.as_ref() == Some(id) && !n.is_failed()).map(|n| n.port)
    }

    /// Sends one command about a key to the node serving it: sent to the key's primary as last
    /// seen, following `MOVED` and `ASK`, and retried elsewhere while a node is unreachable.
    pub fn command(&self, args: &[&str]) -> Result<String, String> {
        let mut port = args.get(1).map(|key| self.primary_for_key(key)).unwrap_or_else(|| self.live_ports()[0]);
        let mut asking = false;
        for _ in 0..10 {
            let reply = if asking {
                super::commands_at(port, &[&["ASKING"], args]).pop().expect("one reply per command")
            } else {
                command_at(port, args)
            };
            match reply {
                Err(e) if e.starts_with("MOVED ") || e.starts_with("ASK ") => {
                    asking = e.starts_with("ASK ");
                    port =
                        e.rsplit(':').next().and_then(|p| p.parse().ok()).ok_or_else(|| format!("bad redirect {e}"))?;
                }
                Err(e) if e.starts_with("CLUSTERDOWN") || e.contains("Connection refused") => {
                    std::thread::sleep(Duration::from_millis(100));
                    port = args.get(1).map(|key| self.primary_for_key(key)).unwrap_or(port);
                    asking = false;
                }
                other => return other,
            }
        }
        Err(format!("{args:?}: too many redirections"))
    }

    /// Moves `slot` from the primary serving it to the primary on `to`, as `redis-cli --cluster
    /// reshard` does: IMPORTING on the target, MIGRATING on the source, the keys moved one by one
    /// with MIGRATE (pausing `pause` after each, so that clients meet the slot half moved and get
    /// ASK), then the slot assigned to the target everywhere (clients get MOVED). Returns how
    /// many keys were moved.
    pub fn migrate_slot(&self, slot: u16, to: u16, pause: Duration) -> usize {
        let layout = self.layout();
        let id_of = |port: u16| layout.iter().find(|n| n.port == port).map(|n| n.id.clone()).expect("no such node");
        let from = self.primary_for_slot(slot);
        assert_ne!(from, to, "slot {slot} is on {to} already");
        let (from_id, to_id, slot_s) = (id_of(from), id_of(to), slot.to_string());
        command_at(to, &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &from_id]).expect("IMPORTING");
        command_at(from, &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &to_id]).expect("MIGRATING");
        let mut moved = 0;
        loop {
            let keys = command_at(from, &["CLUSTER", "GETKEYSINSLOT", &slot_s, "1"]).expect("GETKEYSINSLOT");
            let Some(key) = keys.lines().next().filter(|k| !k.is_empty()) else { break };
            let to_s = to.to_string();
            command_at(from, &["MIGRATE", "127.0.0.1", &to_s, key, "0", "5000"]).expect("MIGRATE");
            moved += 1;
            std::thread::sleep(pause);
        }
        // The target first, then the source, then the other primaries (replicas learn by gossip).
        let mut primaries = vec![to, from];
        primaries.extend(self.primaries().into_iter().filter(|p| *p != to && *p != from));
        for port in primaries {
            command_at(port, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id]).expect("SETSLOT NODE");
        }
        moved
    }

    /// Kills the node on `port` with SIGKILL.
    pub fn kill(&mut self, port: u16) {
        self.nodes.iter_mut().find(|n| n.port() == port).expect("no such node").kill();
    }

    /// Starts the node on `port` again (after [`kill`](Self::kill)): it keeps its `nodes.conf`,
    /// so it rejoins, as a replica if its slots were failed over meanwhile.
    pub fn restart_node(&mut self, port: u16) {
        self.nodes.iter_mut().find(|n| n.port() == port).expect("no such node").restart();
    }

    /// Waits until every live node says `cluster_state:ok` with all 16384 slots served by live
    /// primaries, and knows all six nodes.
    pub fn wait_healthy(&self, limit: Duration) {
        wait_for(limit, "a healthy cluster", || self.health_problem().map_or(Ok(()), Err))
    }

    fn health_problem(&self) -> Option<String> {
        for port in self.live_ports() {
            let info = match command_at(port, &["CLUSTER", "INFO"]) {
                Ok(info) => info,
                Err(e) => return Some(format!("{port}: {e}")),
            };
            for (field, want) in [("cluster_state", "ok"), ("cluster_slots_ok", "16384"), ("cluster_known_nodes", "6")]
            {
                let got = info_field(&info, field);
                if got.as_deref() != Some(want) {
                    return Some(format!("{port}: {field} is {got:?}"));
                }
            }
            let nodes = parse_nodes(&command_at(port, &["CLUSTER", "NODES"]).unwrap_or_default());
            let served: usize =
                nodes.iter().filter(|n| n.is_primary() && !n.is_failed()).map(NodeInfo::slot_count).sum();
            if served != 16384 {
                return Some(format!("{port}: live primaries serve {served} slots"));
            }
        }
        None
    }

    /// Waits until every replica's link to its primary is up and it has every write its primary
    /// has (equal replication offsets).
    pub fn wait_replicated(&self, limit: Duration) {
        wait_for(limit, "replicas in sync", || self.replication_problem().map_or(Ok(()), Err))
    }

    fn replication_problem(&self) -> Option<String> {
        for port in self.live_ports() {
            let info = match command_at(port, &["INFO", "replication"]) {
                Ok(info) => info,
                Err(e) => return Some(format!("{port}: {e}")),
            };
            if info_field(&info, "role").as_deref() != Some("slave") {
                continue;
            }
            let Some(primary) = info_field(&info, "master_port").and_then(|p| p.parse::<u16>().ok()) else {
                return Some(format!("{port}: no master_port"));
            };
            if !self.nodes.iter().any(|n| n.port() == primary && n.is_running()) {
                continue; // a replica of a killed primary that was not promoted
            }
            if info_field(&info, "master_link_status").as_deref() != Some("up") {
                return Some(format!("{port}: link to {primary} down"));
            }
            let theirs = match command_at(primary, &["INFO", "replication"]) {
                Ok(info) => info,
                Err(e) => return Some(format!("{primary}: {e}")),
            };
            let (a, b) = (info_field(&info, "slave_repl_offset"), info_field(&theirs, "master_repl_offset"));
            if a != b {
                return Some(format!("{port}: offset {a:?}, primary {primary} at {b:?}"));
            }
        }
        None
    }

    /// After the primary that `replica` replicates was killed: waits until `replica` serves
    /// slots as a primary and the cluster is healthy again, as every live node sees it.
    pub fn wait_for_promotion(&self, replica: u16, limit: Duration) {
        wait_for(limit, &format!("replica {replica} promoted"), || {
            let layout = self.layout();
            let promoted = layout.iter().any(|n| n.port == replica && n.is_primary() && n.slot_count() > 0);
            match self.health_problem() {
                None if promoted => Ok(()),
                problem => Err(format!("{problem:?} {layout:?}")),
            }
        })
    }
}
