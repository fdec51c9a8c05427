//! `rediss://` is TLS or an error: against a real `redis-server` serving TLS with a CA made at
//! test time, the store connects over TLS with that CA, fails clearly with another CA, and never
//! falls back to plaintext when the port is a plaintext one. URLs of other schemes are refused,
//! naming the URL with its password masked.

mod support;

use std::time::Duration;

use idempotency::{Call, Error, Idempotency, RedisStore, StoreErrorKind};
use support::tls::{TestCa, TlsRedis};
use support::{ms, R};
use tokio::time::Instant;

fn bounded(url: &str) -> idempotency::RedisStoreBuilder {
    RedisStore::builder(url).connect_timeout(Duration::from_secs(2)).timeout(Duration::from_secs(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_connects_over_tls_with_the_given_ca() {
    let ca = TestCa::new("good-ca");
    let redis = TlsRedis::start(&ca);
    let store = bounded(&redis.tls_url()).tls_ca_file(ca.ca()).connect().await.expect("connect over TLS");
    let idem = Idempotency::new(store);
    let first: Result<u32, Error> = idem.run(Call::new("over-tls"), || async { Ok(7) }).await;
    let again: Result<u32, Error> = idem.run(Call::new("over-tls"), || async { Ok(8) }).await;
    assert_eq!((first.unwrap(), again.unwrap()), (7, 7));
    // The store's connection is on the TLS port: the server lists it with that local address.
    let clients = redis.server.command(&["CLIENT", "LIST"]).unwrap();
    let tls_laddr = format!("laddr=127.0.0.1:{}", redis.tls_port);
    assert!(clients.lines().any(|c| c.contains(&tls_laddr)), "no client on the TLS port:\n{clients}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_ca_is_a_clear_error() {
    let (ca, other) = (TestCa::new("server-ca"), TestCa::new("other-ca"));
    let redis = TlsRedis::start(&ca);
    let t = Instant::now();
    let e = bounded(&redis.tls_url()).tls_ca_file(other.ca()).connect().await.expect_err("connected with the wrong CA");
    let message = e.to_string();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{message}");
    assert!(message.contains("certificate") && message.contains("UnknownIssuer"), "{message}");
    assert!(message.contains(&redis.tls_url()), "the error does not name the server: {message}");
    assert!(t.elapsed() <= Duration::from_secs(2) + ms(250), "gave up after {:?}", t.elapsed());
    println!("wrong CA: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_port_given_as_rediss_fails_rather_than_downgrading() {
    let ca = TestCa::new("plain-ca");
    let redis = TlsRedis::start(&ca);
    let plain = format!("rediss://127.0.0.1:{}", redis.server.port());
    let t = Instant::now();
    let got = bounded(&plain).tls_ca_file(ca.ca()).connect().await;
    let e = got.expect_err("a TLS URL connected to a plaintext port");
    assert!(t.elapsed() <= Duration::from_secs(2) + ms(250), "gave up after {:?}", t.elapsed());
    // Nothing reached the server as a command, and nothing stays connected there: the only
    // client left is the one asking.
    support::wait_for(Duration::from_secs(2), "the refused connection to close", || {
        let clients = redis.server.command(&["CLIENT", "LIST"]).unwrap();
        if clients.lines().count() == 1 {
            Ok(())
        } else {
            Err(clients)
        }
    });
    println!("plaintext port as rediss: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_settings_for_a_plaintext_url_are_an_error() {
    let ca = TestCa::new("unused-ca");
    let redis = TlsRedis::start(&ca);
    let e = bounded(&redis.server.url()).tls_ca_file(ca.ca()).connect().await.expect_err("connected in plaintext");
    assert_eq!(e.kind(), StoreErrorKind::Config);
    assert!(e.to_string().contains("is not a TLS URL"), "{e}");
}

#[tokio::test]
async fn other_schemes_are_refused_naming_the_url_without_its_password() {
    for url in ["http://admin:hunter2@127.0.0.1:6379", "127.0.0.1:6379", "redis+unix:///tmp/r.sock", "https://x"] {
        let e = RedisStore::connect(url).await.err().unwrap_or_else(|| panic!("{url} was accepted"));
        let message = e.to_string();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{url}: {message}");
        assert!(message.contains("is not a Redis URL"), "{url}: {message}");
        assert!(!message.contains("hunter2"), "{url}: the password is in the error: {message}");
    }
    let e = RedisStore::connect("http://admin:hunter2@127.0.0.1:6379").await.err().unwrap();
    assert!(e.to_string().contains("http://admin:***@127.0.0.1:6379"), "{e}");
    let _: R<()> = Ok(());
}

/// `rediss-cluster://`: a three-primary cluster whose nodes talk TLS to each other and to
/// clients (they report their TLS ports to a TLS client): calls on keys over every primary work,
/// and every connection the store keeps is on a TLS port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_cluster_connects_every_node_over_tls() {
    let ca = TestCa::new("cluster-ca");
    let nodes: Vec<TlsRedis> = (0..3)
        .map(|_| {
            let bus = support::free_port().to_string();
            TlsRedis::start_with(
                &ca,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                    "--tls-cluster",
                    "yes",
                ],
            )
        })
        .collect();
    let plain: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.server.port())).collect();
    let mut create = std::process::Command::new(support::redis_cli_binary())
        .args(["--cluster", "create"])
        .args(&plain)
        .args(["--cluster-yes"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let created = support::wait_for(Duration::from_secs(30), "redis-cli --cluster create", || {
        create.try_wait().map_err(|e| e.to_string())?.ok_or_else(|| "still running".to_owned())
    });
    assert!(created.success(), "redis-cli --cluster create failed");
    // Every node, not one: the store asks any of them for the slot map, and a node that has not
    // yet heard of every other's slots answers an incomplete one ("Invalid or missing cluster
    // state", seen under load).
    support::wait_for(Duration::from_secs(20), "every node to see the whole cluster", || {
        for node in &nodes {
            let info = node.server.command(&["CLUSTER", "INFO"])?;
            for (field, want) in [("cluster_state", "ok"), ("cluster_slots_ok", "16384"), ("cluster_known_nodes", "3")]
            {
                let got = support::info_field(&info, field);
                if got.as_deref() != Some(want) {
                    return Err(format!("{}: {field} is {got:?}", node.server.port()));
                }
            }
        }
        Ok(())
    });
    let url = format!(
        "rediss-cluster://127.0.0.1:{}?node=127.0.0.1:{}&node=127.0.0.1:{}",
        nodes[0].tls_port, nodes[1].tls_port, nodes[2].tls_port
    );
    let store = RedisStore::builder(&url).tls_ca_file(ca.ca()).connect().await.expect("connect to the TLS cluster");
    let idem = Idempotency::new(store);
    for i in 0..60 {
        let key = format!("tls-cluster:{i}");
        let first: Result<usize, Error> = idem.run(Call::new(key.as_str()), || async move { Ok(i) }).await;
        let again: Result<usize, Error> = idem.run(Call::new(key.as_str()), || async move { Ok(i + 1000) }).await;
        assert_eq!((first.unwrap(), again.unwrap()), (i, i), "{key}");
    }
    for node in &nodes {
        let keys: u64 = node.server.command(&["DBSIZE"]).unwrap().parse().unwrap();
        assert!(keys > 0, "no key on the node of port {}: the calls did not reach every primary", node.server.port());
        let clients = node.server.command(&["CLIENT", "LIST"]).unwrap();
        let ours = clients.lines().filter(|c| !c.contains("cmd=client|list") && !c.contains("flags=S"));
        for client in ours {
            assert!(
                client.contains(&format!("laddr=127.0.0.1:{}", node.tls_port))
                    || client.contains("flags=N cmd=cluster"),
                "a connection off the TLS port on node {}: {client}",
                node.server.port()
            );
        }
    }
}
