//! What operators do with a store's records: read one whole with its lifetime, forget one,
//! scan a prefix page by page (on every primary of a cluster), rotate the shared token secret.

use super::*;

impl RedisStore {
    /// Replaces the token secret every runtime on this store shares (see
    /// [`Store::token_secrets`]) with a new random one, keeping the current one as the previous,
    /// still accepted: for an operator (`idempotency rotate-token-secret`). Processes pick the new
    /// one up when they next connect; until then they sign with the old one, which every process
    /// still accepts. Tokens signed with the secret before the previous one are refused.
    pub async fn rotate_token_secret(&self) -> Result<(), StoreError> {
        let key = keys::token_secret(&self.inner.prefix);
        let previous = format!("{key}:previous");
        let client = self.inner.pool.next();
        let current: Option<String> = self.bounded("rotate", Box::pin(client.get(key.as_str()))).await?;
        if let Some(current) = current {
            let _: Value =
                self.bounded("rotate", Box::pin(client.set(previous.as_str(), current, None, None, false))).await?;
        }
        let fresh = crate::token::TokenKeys::fresh_secret();
        let _: Value = self.bounded("rotate", Box::pin(client.set(key.as_str(), fresh, None, None, false))).await?;
        Ok(())
    }

    /// A record key's value and `PTTL`, read in one step (`inspect.lua`); `Err` naming the type
    /// for a value that is not a string.
    async fn read(&self, client: &Client, record_key: &str) -> Result<replies::Read, StoreError> {
        let reply = scripts::run(client, &scripts::INSPECT, || (vec![record_key.into()], Vec::new()))
            .await
            .map_err(|e| store_error("inspect", e))?;
        replies::inspected(reply)
    }

    pub(super) async fn inspect_inner(&self, key: &str) -> Result<Inspected, StoreError> {
        let record_key = self.record_key(key);
        let (got, ttl, now) =
            within("inspect", self.inner.timeout, self.read(self.client_for(key), &record_key)).await?;
        Ok(match got {
            Ok(None) => Inspected::Absent,
            Ok(Some(bytes)) => match record::view(key, &bytes, Some(ttl), now) {
                Ok(view) => Inspected::Record(view),
                Err(reason) => Inspected::Foreign { reason: reason.to_owned() },
            },
            Err(reason) => Inspected::Foreign { reason },
        })
    }

    pub(super) async fn forget_inner(&self, key: &str, force: bool) -> Result<Forgotten, StoreError> {
        let channel = keys::purge_channel(&self.inner.prefix);
        let args = || vec![if force { "1" } else { "0" }.into(), channel.as_str().into(), key.into()];
        replies::forgotten(self.script("forget", &scripts::FORGET, key, args).await?)
    }

    /// A page of `SCAN` on one node (every primary of a cluster in turn: the cursor is the
    /// node's place in the list and its own cursor), with each key's record read.
    pub(super) async fn scan_inner(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        count: usize,
    ) -> Result<ScanPage, StoreError> {
        let client = self.inner.pool.next();
        let nodes: Vec<Option<fred::types::config::Server>> = if self.inner.clustered {
            let mut primaries =
                client.cached_cluster_state().map(|state| state.unique_primary_nodes()).ok_or_else(|| {
                    StoreError::new(StoreErrorKind::Unavailable, "scan: the cluster's slot map is not known yet")
                })?;
            primaries.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
            primaries.into_iter().map(Some).collect()
        } else {
            vec![None]
        };
        let (node, node_cursor) = match cursor {
            None => (0, "0".to_owned()),
            Some(c) => {
                let (node, rest) =
                    c.split_once(':').and_then(|(n, rest)| Some((n.parse::<usize>().ok()?, rest))).ok_or_else(
                        || StoreError::new(StoreErrorKind::Config, format!("scan: {c:?} is not a scan cursor")),
                    )?;
                (node, rest.to_owned())
            }
        };
        let Some(server) = nodes.get(node) else { return Ok(ScanPage::default()) };
        let pattern = keys::scan_pattern(&self.inner.prefix, prefix);
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        let reply: Value = match server {
            Some(server) => {
                let on_node = client.with_cluster_node(server.clone());
                self.bounded(
                    "scan",
                    Box::pin(on_node.scan_page::<Value, _, _>(node_cursor, pattern, Some(count), None)),
                )
                .await?
            }
            None => {
                self.bounded("scan", Box::pin(client.scan_page::<Value, _, _>(node_cursor, pattern, Some(count), None)))
                    .await?
            }
        };
        let (next_cursor, record_keys) = replies::scan_page(reply)?;
        let mut page = ScanPage { examined: record_keys.len(), ..ScanPage::default() };
        let reads = record_keys.iter().map(|rk| async move {
            let got = within("scan", self.inner.timeout, self.read(client, rk)).await;
            (rk, got)
        });
        for (record_key, got) in join_all(reads).await {
            let Some(key) = keys::full_key_of(&self.inner.prefix, record_key) else { continue };
            match got? {
                // Gone between the SCAN and the GET.
                (Ok(None), _, _) => {}
                (Ok(Some(bytes)), ttl, now) => match record::view(key, &bytes, Some(ttl), now) {
                    Ok(view) => page.records.push(view),
                    Err(reason) => page.foreign.push((key.to_owned(), reason.to_owned())),
                },
                (Err(reason), _, _) => page.foreign.push((key.to_owned(), reason)),
            }
        }
        page.next = if next_cursor != "0" {
            Some(format!("{node}:{next_cursor}"))
        } else if node + 1 < nodes.len() {
            Some(format!("{}:0", node + 1))
        } else {
            None
        };
        Ok(page)
    }
}
