//! A Sentinel group of the test's own: one primary, two replicas and three sentinels on free
//! ports, with helpers to reach the current primary, kill it and wait for the sentinels to
//! promote a replica.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::{command_at, info_field, wait_for, RedisServer};

/// The name the sentinels monitor the primary under.
pub const SERVICE: &str = "mymaster";

/// How long the primary may be unreachable before a sentinel thinks it down.
pub const DOWN_AFTER_MS: u64 = 1000;

/// Data nodes and sentinels.
pub struct SentinelGroup {
    data: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl SentinelGroup {
    /// Starts a primary, two replicas of it and three sentinels monitoring it (quorum 2);
    /// returns once the replicas are in sync and every sentinel knows both replicas and both
    /// other sentinels and agrees on the primary.
    pub fn start() -> SentinelGroup {
        let started = Instant::now();
        let primary = RedisServer::start();
        let of = primary.port().to_string();
        let mut data = vec![primary];
        for _ in 0..2 {
            let of = of.clone();
            data.push(RedisServer::start_with(Arc::new(move |_, _| {
                (Vec::new(), vec!["--replicaof".into(), "127.0.0.1".into(), of.clone()])
            })));
        }
        let primary_port = data[0].port();
        let sentinels = (0..3)
            .map(|_| {
                RedisServer::start_with(Arc::new(move |_, dir| {
                    let conf = dir.join("sentinel.conf");
                    let text = format!(
                        "sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n\
                         sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n\
                         sentinel failover-timeout {SERVICE} 3000\n\
                         sentinel parallel-syncs {SERVICE} 2\n"
                    );
                    std::fs::write(&conf, text).expect("write sentinel.conf");
                    (vec![conf.to_str().unwrap().to_owned(), "--sentinel".into()], Vec::new())
                }))
            })
            .collect();
        let group = SentinelGroup { data, sentinels };
        group.wait_replicated(Duration::from_secs(30));
        group.wait_agreed(Duration::from_secs(30));
        eprintln!(
            "sentinel group: data nodes {:?}, sentinels {:?}, ready in {:?}",
            group.data.iter().map(|n| n.port()).collect::<Vec<_>>(),
            group.sentinels.iter().map(|n| n.port()).collect::<Vec<_>>(),
            started.elapsed()
        );
        group
    }

    /// The group shared by the tests of this binary (started on first use; never killed into:
    /// tests that kill nodes start their own).
    pub fn shared() -> &'static SentinelGroup {
        static SHARED: OnceLock<SentinelGroup> = OnceLock::new();
        SHARED.get_or_init(SentinelGroup::start)
    }

    /// fred's URL of the group: the sentinels and the service name.
    pub fn url(&self) -> String {
        let ports: Vec<u16> = self.sentinels.iter().map(|s| s.port()).collect();
        let rest: Vec<String> = ports[1..].iter().map(|p| format!("node=127.0.0.1:{p}")).collect();
        format!("redis-sentinel://127.0.0.1:{}?{}&sentinelServiceName={SERVICE}", ports[0], rest.join("&"))
    }

    /// The primary's port as the first sentinel that answers reports it.
    pub fn primary_port(&self) -> u16 {
        self.sentinel_views().into_iter().flatten().next().expect("no sentinel answers")
    }

    /// What each sentinel reports as the primary's port (`None` where it does not answer).
    pub fn sentinel_views(&self) -> Vec<Option<u16>> {
        self.sentinels
            .iter()
            .map(|s| {
                let reply = s.command(&["SENTINEL", "get-master-addr-by-name", SERVICE]).ok()?;
                reply.lines().nth(1)?.parse().ok()
            })
            .collect()
    }

    /// Sends a command to the current primary.
    pub fn primary_command(&self, args: &[&str]) -> Result<String, String> {
        command_at(self.primary_port(), args)
    }

    /// Kills the current primary with SIGKILL; returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary_port();
        self.data.iter_mut().find(|n| n.port() == port).expect("primary is ours").kill();
        port
    }

    /// Waits until every sentinel reports a primary other than `old`, the same one, and that
    /// node says it is a primary; returns its port.
    pub fn wait_for_new_primary(&self, old: u16, limit: Duration) -> u16 {
        wait_for(limit, "a new primary", || {
            let views = self.sentinel_views();
            if let Some(Some(new)) = views.first() {
                let agreed = views.iter().all(|v| *v == Some(*new));
                let role = command_at(*new, &["ROLE"]).unwrap_or_default();
                if *new != old && agreed && role.lines().next() == Some("master") {
                    return Ok(*new);
                }
            }
            Err(format!("sentinels say {views:?}"))
        })
    }

    /// Waits until every live replica of the current primary is linked and has all its writes.
    pub fn wait_replicated(&self, limit: Duration) {
        wait_for(limit, "replicas in sync", || self.replication_problem().map_or(Ok(()), Err))
    }

    fn replication_problem(&self) -> Option<String> {
        let Some(primary) = self
            .data
            .iter()
            .find(|n| n.is_running() && n.command(&["ROLE"]).unwrap_or_default().lines().next() == Some("master"))
        else {
            return Some("no data node is a primary".into());
        };
        let info = match primary.command(&["INFO", "replication"]) {
            Ok(info) => info,
            Err(e) => return Some(format!("{}: {e}", primary.port())),
        };
        let offset = info_field(&info, "master_repl_offset");
        for node in self.data.iter().filter(|n| n.is_running() && n.port() != primary.port()) {
            let theirs = node.command(&["INFO", "replication"]).unwrap_or_default();
            if info_field(&theirs, "master_port") != Some(primary.port().to_string()) {
                return Some(format!("{} does not replicate {} yet", node.port(), primary.port()));
            }
            if info_field(&theirs, "master_link_status").as_deref() != Some("up") {
                return Some(format!("{}: link down", node.port()));
            }
            if info_field(&theirs, "slave_repl_offset") != offset {
                return Some(format!("{}: behind {offset:?}", node.port()));
            }
        }
        None
    }

    /// Waits until every sentinel knows the two replicas and the two other sentinels, agrees on
    /// the primary, and can reach a quorum.
    fn wait_agreed(&self, limit: Duration) {
        wait_for(limit, "sentinels agreed", || {
            let problem = self.sentinels.iter().find_map(|s| {
                let master = s.command(&["SENTINEL", "master", SERVICE]).unwrap_or_default();
                let fields: Vec<&str> = master.lines().collect();
                let field = |name: &str| fields.chunks(2).find(|kv| kv[0] == name).and_then(|kv| kv.get(1).copied());
                if field("num-slaves") != Some("2") || field("num-other-sentinels") != Some("2") {
                    return Some(format!(
                        "sentinel {}: {:?}",
                        s.port(),
                        (field("num-slaves"), field("num-other-sentinels"))
                    ));
                }
                if let Err(e) = s.command(&["SENTINEL", "ckquorum", SERVICE]) {
                    return Some(format!("sentinel {}: {e}", s.port()));
                }
                None
            });
            let views = self.sentinel_views();
            let agreed = views.iter().all(|v| v.is_some() && *v == views[0]);
            match problem {
                None if agreed => Ok(()),
                p => Err(format!("{p:?} {views:?}")),
            }
        })
    }
}
