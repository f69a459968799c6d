//! The routing topic, `<log-topic>-owners`: where each shard's owner
//! answers requests. One partition, compacted, one key per shard (its
//! number in decimal), written by a node when it has taken a shard and
//! when it lets go of it. Every node reads it from the start and follows
//! it, so that any node can forward a request to the shard's owner.
//!
//! ```text
//! key     value (Route)
//! "7"     writer, addr, at, released=false   the writer owns shard 7 and answers at addr
//! "7"     writer, addr, at, released=true    the writer let go of it (ignored if it no
//!                                            longer was the owner by this topic)
//! "7"     writer, addr, at, leaving=true     the writer owns it and is stopping: it
//!                                            lets go once its requests are drained
//! "7"     writer, addr, at, held=true        the writer owns it without the group's
//!                                            word: it lets go once another node says
//!                                            it owns it
//! ```
//!
//! Every record is sealed with the cluster key ([`super::seal`]); one
//! without a valid seal is refused, so that no one but a node of the
//! cluster can send its requests (and its callers' grants) elsewhere.
//!
//! The routing topic only says where to send a request; who may change a
//! shard is decided by the claims in the schedule log. A request sent to a
//! node that no longer owns the shard is refused there, and sent again
//! once the topic names the new owner.

use prost::Message as _;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Route {
    /// The node incarnation (as in the schedule log's records).
    #[prost(uint64, tag = "1")]
    pub writer: u64,
    /// Where it answers gRPC calls (`--advertise-addr`).
    #[prost(string, tag = "2")]
    pub addr: String,
    /// When it was written (wall clock, for people reading the topic).
    #[prost(uint64, tag = "3")]
    pub at_ms: u64,
    #[prost(bool, tag = "4")]
    pub released: bool,
    /// The writer is stopping: it lets go of the shard once its requests
    /// are drained, and its standby takes the shard at that release
    /// rather than when the writer stops answering.
    #[prost(bool, tag = "5")]
    pub leaving: bool,
    /// The writer holds the shard without the group giving it: it took it
    /// over from a gone owner, or the group took it back and has not said
    /// whose it is now. It lets go of it, cleanly, as soon as another node
    /// says it owns the shard; that node waits for the release rather than
    /// fence the writer with its claim.
    #[prost(bool, tag = "6")]
    pub held: bool,
}

/// The routing topic of the schedule log `log_topic`.
pub fn topic_of(log_topic: &str) -> String {
    format!("{log_topic}-owners")
}

pub fn key(shard: u32) -> Vec<u8> {
    shard.to_string().into_bytes()
}

/// A record of the routing topic that no node of the cluster wrote: it
/// carries no valid seal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forged;

/// A record of the routing topic, and whether it carries the cluster's
/// seal: its shard and route, or `None` for a sealed record that is none
/// (from a newer release): it is skipped.
pub fn read(key: Option<&[u8]>, value: Option<&[u8]>, sealed: bool) -> Result<Option<(u32, Route)>, Forged> {
    if !sealed {
        return Err(Forged);
    }
    let read = || {
        let shard = std::str::from_utf8(key?).ok()?.parse().ok()?;
        let route = Route::decode(value?).ok()?;
        Some((shard, route))
    };
    Ok(read())
}

/// Who owns each shard by the routing topic: a claim names its writer, a
/// release clears the shard only if its writer is the one named, and a
/// stopping node's claim never replaces another node's (see
/// [`Table::apply`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    owners: Vec<Option<Route>>,
}

impl Table {
    pub fn new(shards: u32) -> Table {
        Table { owners: vec![None; shards as usize] }
    }

    /// Takes in what the topic says of `shard`: whether it names its
    /// writer the owner. A stopping node says again the shards it still
    /// holds; such a word read after another node said it owns the shard
    /// is late (that node took the shard since), and names no one.
    pub fn apply(&mut self, shard: u32, route: Route) -> bool {
        let Some(slot) = self.owners.get_mut(shard as usize) else {
            return false;
        };
        if route.released {
            if slot.as_ref().is_some_and(|r| r.writer == route.writer) {
                *slot = None;
            }
            return false;
        }
        if route.leaving && slot.as_ref().is_some_and(|r| r.writer != route.writer && !r.leaving) {
            return false;
        }
        *slot = Some(route);
        true
    }

    /// The node incarnation the topic names the owner of `shard`, if any.
    pub fn writer_of(&self, shard: u32) -> Option<u64> {
        self.owners.get(shard as usize)?.as_ref().map(|r| r.writer)
    }

    /// What the topic last said of the owner of `shard`, if it names one.
    pub fn route_of(&self, shard: u32) -> Option<&Route> {
        self.owners.get(shard as usize)?.as_ref()
    }

    /// Where the owner of `shard` answers, if the topic names one.
    pub fn addr_of(&self, shard: u32) -> Option<&str> {
        self.owners.get(shard as usize)?.as_ref().map(|r| r.addr.as_str())
    }

    /// The shards whose standbys include the node at `me`: each owner's
    /// standbys are the `replicas` nodes after it in the order of their
    /// addresses (the nodes the topic names, and `me`), going round.
    pub fn standby_for(&self, me: &str, replicas: usize) -> Vec<u32> {
        let mut nodes = self.addrs();
        if !nodes.iter().any(|a| a == me) {
            nodes.push(me.to_owned());
            nodes.sort();
        }
        let at = |addr: &str| nodes.iter().position(|a| a == addr);
        let (Some(mine), count) = (at(me), nodes.len()) else {
            return Vec::new();
        };
        (0..)
            .zip(&self.owners)
            .filter_map(|(shard, owner)| {
                let owner = at(&owner.as_ref()?.addr)?;
                let after = (mine + count - owner) % count;
                (after != 0 && after <= replicas).then_some(shard)
            })
            .collect()
    }

    /// Every address the topic names, once each.
    pub fn addrs(&self) -> Vec<String> {
        let mut addrs: Vec<String> = self.owners.iter().flatten().map(|r| r.addr.clone()).collect();
        addrs.sort();
        addrs.dedup();
        addrs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(writer: u64, addr: &str, released: bool) -> Route {
        Route { writer, addr: addr.into(), at_ms: 1, released, ..Route::default() }
    }

    #[test]
    fn a_release_clears_only_its_writers_claim() {
        let mut table = Table::new(3);
        table.apply(1, route(7, "http://a:1", false));
        table.apply(1, route(8, "http://b:1", false));
        table.apply(1, route(7, "http://a:1", true));
        assert_eq!(table.addr_of(1), Some("http://b:1"), "a late release of the old owner changes nothing");
        table.apply(1, route(8, "http://b:1", true));
        assert_eq!(table.addr_of(1), None);
        table.apply(9, route(8, "http://b:1", false));
        assert_eq!(table.addrs(), Vec::<String>::new(), "a shard out of range is skipped");
        table.apply(1, route(8, "http://b:1", false));
        let leaving = |writer, addr: &str| Route { leaving: true, ..route(writer, addr, false) };
        assert!(!table.apply(1, leaving(7, "http://a:1")), "a stopping node's late word");
        assert_eq!(table.addr_of(1), Some("http://b:1"));
        assert!(table.apply(1, leaving(8, "http://b:1")), "the owner itself stopping");
        assert!(
            table.apply(1, leaving(7, "http://a:1")),
            "over a stopping owner, a stopping one's word counts"
        );
    }

    #[test]
    fn each_owner_s_standbys_are_the_nodes_after_it() {
        let mut table = Table::new(4);
        table.apply(0, route(1, "http://a:1", false));
        table.apply(1, route(2, "http://b:1", false));
        table.apply(2, route(3, "http://c:1", false));
        table.apply(3, route(3, "http://c:1", false));
        assert_eq!(table.standby_for("http://b:1", 1), [0], "b stands by for a");
        assert_eq!(table.standby_for("http://a:1", 1), [2, 3], "a for c, going round");
        assert_eq!(table.standby_for("http://a:1", 2), [1, 2, 3]);
        assert_eq!(table.standby_for("http://a:1", 5), [1, 2, 3], "never for its own shards");
        assert_eq!(table.standby_for("http://a:1", 0), Vec::<u32>::new());
        assert_eq!(table.standby_for("http://d:1", 1), [2, 3], "a node that owns none counts too");
    }

    #[test]
    fn records_round_trip_and_strays_are_skipped() {
        let r = route(3, "http://c:2", false);
        assert_eq!(read(Some(&key(11)), Some(&r.encode_to_vec()), true), Ok(Some((11, r.clone()))));
        assert_eq!(read(Some(b"x"), Some(b""), true), Ok(None));
        assert_eq!(read(Some(&key(1)), None, true), Ok(None));
        assert_eq!(read(Some(&key(11)), Some(&r.encode_to_vec()), false), Err(Forged), "unsealed");
    }
}
