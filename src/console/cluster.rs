//! The cluster: its nodes, the shards each owns and keeps standby, how far
//! each copy is behind the schedule log, and the latest moves, as
//! `Admin/DescribeCluster` answers (any node asks every other). For a
//! token that may see the whole server (`admin = "all"`).

use std::fmt::Write as _;

use super::html::{esc, refused, time};
use crate::{
    proto,
    scheduler::{Call, Scheduler},
};

fn role(r: i32) -> &'static str {
    match proto::CopyRole::try_from(r) {
        Ok(proto::CopyRole::Owner) => "owner",
        Ok(proto::CopyRole::Standby) => "standby",
        Ok(proto::CopyRole::Taking) => "taking",
        Ok(proto::CopyRole::LettingGo) => "letting go",
        _ => "?",
    }
}

/// How far a copy is behind the log, as a person reads it.
fn behind(c: &proto::ShardCopy) -> String {
    match (c.applied, c.log_end) {
        (Some(applied), Some(end)) => (end - applied).max(0).to_string(),
        (Some(_), None) => "unknown (the log's end could not be read)".to_owned(),
        _ => "–".to_owned(),
    }
}

fn node_name(addr: &str) -> &str {
    if addr.is_empty() { "this server" } else { addr }
}

pub(super) async fn render(scheduler: &dyn Scheduler, call: &Call) -> String {
    let d = match scheduler.describe(call).await {
        Ok(d) => d,
        Err(e) => return refused(e),
    };
    let mut out = String::new();
    let _ = write!(
        out,
        "<p id=\"mode\">{} · {} shards · {} node(s) answered.</p>",
        if d.cluster { "Cluster mode" } else { "Standalone: one node owns every shard" },
        d.shards,
        d.nodes.len()
    );
    for missing in &d.unanswered {
        let _ = write!(out, "<p class=\"warn\">Did not answer: {}</p>", esc(missing));
    }

    // By shard: who owns it, who stands by, how far each copy is behind.
    out.push_str(
        "<h2>Shards</h2><table id=\"shards\"><thead><tr><th>Shard</th><th>Owner</th><th>Pending</th>\
         <th>Behind the log</th><th>Standby copies (behind)</th></tr></thead><tbody>",
    );
    for shard in 0..d.shards {
        let copies: Vec<(&str, &proto::ShardCopy)> = d
            .nodes
            .iter()
            .flat_map(|n| {
                n.copies.iter().filter(move |c| c.shard == shard).map(move |c| (n.addr.as_str(), c))
            })
            .collect();
        let owner = copies.iter().find(|(_, c)| c.role != proto::CopyRole::Standby as i32);
        let standbys: Vec<String> = copies
            .iter()
            .filter(|(_, c)| c.role == proto::CopyRole::Standby as i32)
            .map(|(addr, c)| format!("{} ({})", esc(node_name(addr)), behind(c)))
            .collect();
        let _ = match owner {
            Some((addr, c)) => write!(
                out,
                "<tr><td>{shard}</td><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(node_name(addr)),
                if c.role == proto::CopyRole::Owner as i32 {
                    String::new()
                } else {
                    format!(" ({})", role(c.role))
                },
                c.pending,
                behind(c),
                if standbys.is_empty() { "none".to_owned() } else { standbys.join(", ") }
            ),
            None => write!(
                out,
                "<tr class=\"warn\"><td>{shard}</td><td>no node answered for it</td><td></td><td></td><td>{}</td></tr>",
                if standbys.is_empty() { "none".to_owned() } else { standbys.join(", ") }
            ),
        };
    }
    out.push_str("</tbody></table>");

    // By node.
    out.push_str(
        "<h2>Nodes</h2><table id=\"nodes\"><thead><tr><th>Node</th><th>Owns shards</th><th>Keeps standby copies of shards</th>\
         <th>As of</th></tr></thead><tbody>",
    );
    for n in &d.nodes {
        let list = |want: proto::CopyRole| {
            let shards: Vec<String> =
                n.copies.iter().filter(|c| c.role == want as i32).map(|c| c.shard.to_string()).collect();
            if shards.is_empty() { "none".to_owned() } else { shards.join(", ") }
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(node_name(&n.addr)),
            list(proto::CopyRole::Owner),
            list(proto::CopyRole::Standby),
            time(n.as_of)
        );
    }
    out.push_str("</tbody></table>");

    // The latest moves, every node's, newest first.
    let mut moves: Vec<(&str, &proto::ShardMove)> =
        d.nodes.iter().flat_map(|n| n.moves.iter().map(move |m| (n.addr.as_str(), m))).collect();
    moves.sort_by_key(|(_, m)| std::cmp::Reverse(m.at.map(|t| (t.seconds, t.nanos))));
    out.push_str("<h2>Recent moves</h2>");
    if moves.is_empty() {
        out.push_str("<p>None since the nodes started.</p>");
    } else {
        out.push_str(
            "<table id=\"moves\"><thead><tr><th>When</th><th>Node</th><th>Shard</th><th>What</th></tr></thead><tbody>",
        );
        for (addr, m) in moves.iter().take(100) {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                time(m.at),
                esc(node_name(addr)),
                m.shard,
                esc(&m.what)
            );
        }
        out.push_str("</tbody></table>");
    }
    out
}
