//! The shape of the library, read from its source: which module imports
//! which (`crate::module` anywhere outside test code). The modules must
//! form no circle, settings and errors must stay leaves, and the tools must
//! stay out of the product.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file of the library (the binary's own files left out), by
/// path relative to `src/`.
fn library_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "bin") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path.strip_prefix(src()).unwrap().to_owned());
            }
        }
    }
    let mut files = Vec::new();
    walk(&src(), &mut files);
    files.sort();
    files
}

/// The code of a file: without comments, and without its test code (a
/// `#[cfg(test)]` item to its end: a `mod tests;` line, or the braces that
/// follow).
fn without_tests(text: &str) -> String {
    let code = code_of(text);
    let mut out = String::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let end = match (item.find(';'), item.find('{')) {
            (Some(semi), Some(brace)) if semi < brace => semi + 1,
            (_, Some(brace)) => closing_brace(item, brace).map_or(item.len(), |close| close + 1),
            (Some(semi), None) => semi + 1,
            (None, None) => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Where the brace that closes the one at `open` in `code` is.
fn closing_brace(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `text` without its comments, and with every string and character
/// literal emptied: what is left is code, whose braces and slashes are its
/// own.
fn code_of(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        if at(i) == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(i) == '/' && at(i + 1) == '*' {
            i += 2;
            while i < c.len() && !(at(i) == '*' && at(i + 1) == '/') {
                i += 1;
            }
            i += 2;
        } else if at(i) == 'r'
            && !ident_before
            && (at(i + 1) == '"' || (at(i + 1) == '#' && at(i + 2) != '['))
        {
            // A raw string: r"...", r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            if at(j) != '"' {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            while j < c.len() && !(c[j] == '"' && (1..=hashes).all(|h| at(j + h) == '#')) {
                j += 1;
            }
            out.push_str("\"\"");
            i = j + 1 + hashes;
        } else if at(i) == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else if at(i) == '\'' && (at(i + 2) == '\'' || at(i + 1) == '\\') {
            // A character literal ('"', '{', '\n'); a lifetime has no
            // closing quote.
            let mut j = i + 2;
            while j < c.len() && c[j] != '\'' {
                j += 1;
            }
            out.push_str("' '");
            i = j + 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The names a file reaches through `crate::`: the first segment of every
/// `crate::a::...` path and of every item of a `use crate::{a, b::c}`.
fn crate_paths(text: &str) -> BTreeSet<String> {
    paths_after(text, "crate::")
}

/// The first segments of the paths that follow `prefix` (`crate::`,
/// `super::`), in a group or alone.
fn paths_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let tail = &rest[at + prefix.len()..];
        if let Some(group) = tail.strip_prefix('{') {
            // Top-level items of the group: split at commas outside braces.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            names.insert(first_segment(&item));
        } else {
            names.insert(first_segment(tail));
        }
        rest = tail;
    }
    names.remove("");
    names
}

fn first_segment(path: &str) -> String {
    path.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// What a name at the crate root is: its module (the root re-exports a few
/// items of theirs).
fn module_of_root_name(name: &str) -> String {
    match name {
        "Error" => "error".into(),
        "Listeners" | "run" | "run_with_clock" => "server".into(),
        other => other.into(),
    }
}

/// Module → the modules it imports, one level under the crate root.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in library_files() {
        let top = file
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(src().join(&file)).unwrap();
        let deps = graph.entry(top.clone()).or_default();
        for name in crate_paths(&without_tests(&text)) {
            let module = module_of_root_name(&name);
            if module != top {
                deps.insert(module);
            }
        }
    }
    graph
}

/// A circle in `graph`, if there is one, as the modules along it.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_modules_form_no_circle() {
    let graph = module_graph();
    for expected in
        ["api", "service", "node", "cluster", "shard", "store", "dispatcher", "kafka", "config", "server"]
    {
        assert!(graph.contains_key(expected), "no module {expected} in {:?}", graph.keys());
    }
    if let Some(circle) = find_circle(&graph) {
        panic!("an import circle: {}\n{graph:#?}", circle.join(" → "));
    }
}

/// A file's module path: `kafka/producer.rs` is `kafka::producer`,
/// `kafka/mod.rs` is `kafka`.
fn module_path(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> =
        file.with_extension("").components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// Every `crate::`, `super::` and `self::` path in `text`, groups of `use`
/// trees expanded, each as its segments.
fn relative_paths(text: &str) -> Vec<Vec<String>> {
    /// The paths of a use tree at the start of `s` (segments, then a group
    /// or a name), each after `prefix`.
    fn tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        let mut rest = s;
        loop {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            rest = &rest[name.len()..];
            if !name.is_empty() {
                path.push(name);
            }
            let Some(after) = rest.strip_prefix("::") else { break };
            rest = after.trim_start();
            if let Some(group) = rest.strip_prefix('{') {
                let (mut depth, mut start) = (0, 0);
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            tree(group[start..i].trim(), &path, out);
                            return;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            tree(group[start..i].trim(), &path, out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
        }
        if path.len() > prefix.len() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let head = &start[..start.len() - 2];
        let mut rest = text;
        while let Some(at) = rest.find(start) {
            let before = rest[..at].chars().next_back();
            let tail = &rest[at + head.len()..];
            rest = &rest[at + start.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            tree(tail, &[head.to_owned()], &mut out);
        }
    }
    out
}

/// Every library file and the files it imports, each by its module path.
fn file_graph() -> BTreeMap<String, BTreeSet<String>> {
    let files: BTreeMap<Vec<String>, PathBuf> =
        library_files().into_iter().map(|f| (module_path(&f), f)).collect();
    let resolve = |module: &[String], path: &[String]| -> Option<Vec<String>> {
        let (mut base, mut rest): (Vec<String>, &[String]) = match path.first()?.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (module.to_vec(), &path[1..]),
            "super" => (module.to_vec(), path),
            _ => return None,
        };
        while rest.first().is_some_and(|p| p == "super") {
            base.pop();
            rest = &rest[1..];
        }
        (0..=rest.len())
            .rev()
            .map(|n| [base.clone(), rest[..n].to_vec()].concat())
            .find(|candidate| files.contains_key(candidate))
    };
    let mut graph = BTreeMap::new();
    for (module, file) in &files {
        let text = without_tests(&std::fs::read_to_string(src().join(file)).unwrap());
        let deps: BTreeSet<String> = relative_paths(&text)
            .iter()
            .filter_map(|p| resolve(module, p))
            .filter(|target| target != module)
            .map(|target| target.join("::"))
            .collect();
        graph.insert(module.join("::"), deps);
    }
    graph
}

/// Within a module too, no file imports a file that imports it back: a
/// circle of files is one room pretending to be two.
#[test]
fn the_files_form_no_circle() {
    let graph = file_graph();
    assert!(graph.contains_key("kafka::producer") && graph.contains_key(""), "{:?}", graph.keys());
    assert!(graph["kafka::transactions"].contains("kafka::report"), "{:?}", graph["kafka::transactions"]);
    if let Some(circle) = find_circle(&graph) {
        panic!("an import circle between files: {}", circle.join(" → "));
    }
}

#[test]
fn the_circle_finder_finds_circles() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("config", &["shard"][..]),
        ("shard", &["dispatcher"]),
        ("dispatcher", &["kafka"]),
        ("kafka", &["secret"]),
        ("secret", &["config"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.iter().map(|s| s.to_string()).collect()))
    .collect();
    let circle = find_circle(&graph).expect("the circle of the old layout");
    assert_eq!(circle.first(), circle.last());
    assert_eq!(circle.len(), 6, "{circle:?}");
    assert_eq!(
        crate_paths("use crate::{a, b::{C, D}, e::f};\nlet x = crate::g::h();"),
        ["a", "b", "e", "g"].map(str::to_owned).into()
    );
    assert_eq!(without_tests("a\n#[cfg(test)]\nmod tests {\n fn x() { crate::z(); }\n}\nb"), "a\n\nb");
    let paths = relative_paths("use super::{a::{B, c}, d};\nlet x = crate::e::f(); use self::g as h;");
    let shown: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(shown, ["crate::e::f", "super::a::B", "super::a::c", "super::d", "self::g"]);
    assert_eq!(without_tests("//! see [`crate::node`]\nuse x; // crate::y"), "\nuse x; ");
}

#[test]
fn settings_secrets_and_the_domain_are_leaves() {
    let graph = module_graph();
    let allowed: [(&str, &[&str]); 9] = [
        // The settings read the secrets map and the store's durability, and
        // write lengths of time as the domain does; they build nothing.
        ("config", &["message", "secret", "store"]),
        ("secret", &[]),
        // TLS follows its files as the tokens do, through the leaf that
        // says when files change.
        ("tls", &["watched"]),
        ("watched", &[]),
        ("message", &[]),
        // What a shard is asked and answers, in the domain's terms (a
        // dispatch policy's lanes among them).
        ("command", &["message", "policy"]),
        ("clock", &["message"]),
        ("metrics", &[]),
        ("error", &["kafka", "message", "store"]),
    ];
    for (module, may) in allowed {
        let deps = &graph[module];
        let extra: Vec<_> = deps.iter().filter(|d| !may.contains(&d.as_str())).collect();
        assert!(extra.is_empty(), "{module} imports {extra:?}; it may import only {may:?}");
    }
}

#[test]
fn the_core_does_not_know_its_callers() {
    let graph = module_graph();
    let depends_on = |module: &str, on: &str| {
        // Transitively.
        let mut seen = BTreeSet::new();
        let mut todo = vec![module.to_owned()];
        while let Some(m) = todo.pop() {
            for d in graph.get(&m).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen.contains(on)
    };
    for (lower, upper) in [
        ("command", "store"),
        ("store", "dispatcher"),
        ("store", "node"),
        ("dispatcher", "node"),
        ("node", "service"),
        ("service", "api"),
        ("api", "server"),
        ("store", "kafka"),
        ("kafka", "store"),
        ("config", "server"),
    ] {
        assert!(!depends_on(lower, upper), "{lower} depends on {upper}");
    }
}

/// Cluster mode is one wing: the gRPC adapter serves a `Scheduler` (the
/// cluster's router wraps the local one), the node routes over a
/// `ShardSet` (the cluster is one), the dispatcher records and asks leave
/// to produce through its seams, and the store and the shard serve either
/// mode alike. Only the wiring (`server`) chooses.
#[test]
fn cluster_mode_is_reached_only_through_seams() {
    let graph = module_graph();
    for (module, imports) in &graph {
        if module == "cluster" || module == "server" {
            continue;
        }
        assert!(
            !imports.contains("cluster"),
            "{module} imports cluster; cluster mode plugs in through a seam (Scheduler, ShardSet, \
             Recorder, Gate) instead"
        );
    }
}

#[test]
fn the_tools_are_not_in_the_product() {
    for gone in ["bench", "cli", "client"] {
        assert!(
            !src().join(format!("{gone}.rs")).exists() && !src().join(gone).exists(),
            "src/{gone} belongs to its own crate or to the binary"
        );
    }
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    for module in ["bench", "cli", "client"] {
        assert!(!lib.contains(&format!("mod {module};")), "lib.rs declares {module}");
    }
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let dependencies = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    assert!(!dependencies.contains("testkit"), "the test kit is a dev-dependency only");
    assert!(!dependencies.contains("tempfile"), "the product makes no temp dirs");
}

/// The store's byte layout (`schema`), what its records mean (`view`) and
/// its writer are its own: its modules are private, so the compiler holds
/// every other file to the handle and the command vocabulary, and no file
/// outside the store names them.
#[test]
fn the_stores_layout_and_writer_are_its_own() {
    let handle = std::fs::read_to_string(src().join("store/mod.rs")).unwrap();
    let public: Vec<_> = handle.lines().filter(|l| l.trim_start().starts_with("pub mod")).collect();
    assert!(public.is_empty(), "store/mod.rs makes a module public: {public:?}");
    for file in library_files() {
        if file.starts_with("store") {
            continue;
        }
        let text = without_tests(&std::fs::read_to_string(src().join(&file)).unwrap());
        for inner in ["store::schema", "store::view", "store::writer", "schema::"] {
            assert!(!text.contains(inner), "{} names the store's {inner}", file.display());
        }
    }
}

/// A shard's readers hold its store as a `Reader`, which changes nothing:
/// the `ShardSet` hands out only that, and changes go through its calls
/// (`change`, `schedule_batch`, `write_rows`). Only the files that run a
/// shard (open it, dispatch it, apply its log) hold the `Store` itself.
#[test]
fn readers_hold_a_reader_not_the_store() {
    let shard_set = std::fs::read_to_string(src().join("node/shard_set.rs")).unwrap();
    assert!(shard_set.contains("-> Result<Reader, StoreError>"), "ShardSet hands out a shard's Reader");
    let readers =
        ["node/mod.rs", "series/", "console/", "service.rs", "admin.rs", "api/", "bulk.rs", "status.rs"];
    for file in library_files() {
        let path = file.to_string_lossy().replace('\\', "/");
        if !readers.iter().any(|r| path.starts_with(r)) {
            continue;
        }
        let code = code_of(&without_tests(&std::fs::read_to_string(src().join(&file)).unwrap()));
        // `Error::Store(..)`: the error's variant, not the store.
        let code = code.replace("Error::Store", "Error::S");
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        let named = code.match_indices("Store").any(|(at, word)| {
            !ident(code[..at].chars().next_back()) && !ident(code[at + word.len()..].chars().next())
        });
        assert!(!named, "{path} holds a shard's Store: readers hold a Reader");
    }
}

/// A stored kind is a table (`command::Table`): the store's writer and
/// reads, the shard sets, the cluster's front and replica conversions take
/// any table alike, so that a new one is its variant and rules, its key
/// prefixes, its key mark in the log, and its room. Only those files (and
/// the policy table's watch, kept in memory) name a particular table.
#[test]
fn a_stored_kind_is_a_table_not_a_path_through_the_tree() {
    let may_name = [
        "command/table.rs",
        "store/schema/table.rs",
        "store/policy.rs",
        "cluster/log/record.rs",
        "cluster/replica/mod.rs",
    ];
    let layers = ["store/", "node/", "cluster/", "shard.rs", "dispatcher/", "command/"];
    for file in library_files() {
        let path = file.to_string_lossy().replace('\\', "/");
        let test_code = path.contains("/tests/") || path.ends_with("tests.rs");
        if test_code || may_name.contains(&path.as_str()) || !layers.iter().any(|l| path.starts_with(l)) {
            continue;
        }
        let code = code_of(&without_tests(&std::fs::read_to_string(src().join(&file)).unwrap()));
        for named in ["Table::Series", "Table::Policy", "Table::Ingress", "Rows::Policy", "Rows::Series"] {
            assert!(!code.contains(named), "{path} names a particular table ({named})");
        }
        for old in ["write_series", "write_policies", "SeriesWrite", "PolicyWrite"] {
            assert!(!code.contains(old), "{path} has a path of its own for one stored kind ({old})");
        }
    }
}

/// Every seam's errors are types, not bare strings: a caller can tell one
/// failure from another, and the words are said once, where it fails.
#[test]
fn no_error_is_a_bare_string() {
    let mut files = library_files();
    files.extend(
        std::fs::read_dir(src().join("bin/hourglass"))
            .unwrap()
            .chain(std::fs::read_dir(src().join("bin/hourglass/client")).unwrap())
            .map(|e| e.unwrap().path().strip_prefix(src()).unwrap().to_owned()),
    );
    for file in files.into_iter().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
        let text = without_tests(&std::fs::read_to_string(src().join(&file)).unwrap());
        let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for line in flat.split("Result<").skip(1) {
            // The error type of this `Result<`: after its first top-level comma.
            let (mut depth, mut error) = (0, None);
            for (i, c) in line.char_indices() {
                match c {
                    '<' | '(' => depth += 1,
                    '>' | ')' if depth == 0 => break,
                    '>' | ')' => depth -= 1,
                    ',' if depth == 0 => {
                        error = Some(line[i + 1..].trim_start());
                        break;
                    }
                    _ => {}
                }
            }
            if let Some(error) = error {
                assert!(
                    !error.starts_with("String>") && !error.starts_with("String >"),
                    "{} returns a bare String as an error: Result<{}",
                    file.display(),
                    &line[..line.len().min(80)]
                );
            }
        }
    }
}

/// No struct holds more than 15 fields: past that it is several things,
/// each of which wants a name. The exceptions are formats whose fields are
/// the format: the store's `Meta` record, and `Config`, the settings as
/// flags, environment variables and file keys (declared once, by the
/// `settings!` macro, and turned into each layer's own settings in
/// `server/settings.rs`, none of which is wide).
#[test]
fn no_struct_has_more_than_15_fields() {
    const STORED: &[&str] = &["Meta", "Config"];
    let declared = |name: &str| {
        library_files().iter().any(|f| {
            let text = std::fs::read_to_string(src().join(f)).unwrap();
            text.contains(&format!("pub struct {name} {{"))
        })
    };
    for name in STORED {
        assert!(declared(name), "{name} is no longer declared: take it off the exceptions");
    }
    let mut files = library_files();
    files.extend(
        std::fs::read_dir(src().join("bin/hourglass"))
            .unwrap()
            .chain(std::fs::read_dir(src().join("bin/hourglass/client")).unwrap())
            .map(|e| e.unwrap().path().strip_prefix(src()).unwrap().to_owned())
            .filter(|p| p.extension().is_some_and(|e| e == "rs")),
    );
    let mut wide = Vec::new();
    for file in files {
        let text = without_tests(&std::fs::read_to_string(src().join(&file)).unwrap());
        let mut rest = text.as_str();
        while let Some(at) = rest.find("struct ") {
            rest = &rest[at + "struct ".len()..];
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let (Some(open), semi) = (rest.find('{'), rest.find(';')) else { continue };
            if semi.is_some_and(|s| s < open) || rest[..open].contains('(') {
                continue;
            }
            let (mut depth, mut fields, mut line_start) = (0usize, 0, true);
            for (i, c) in rest[open + 1..].char_indices() {
                match c {
                    '{' | '(' | '<' | '[' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' | ')' | '>' | ']' => depth = depth.saturating_sub(1),
                    '\n' => line_start = true,
                    ':' if depth == 0 && line_start => {
                        let line = rest[open + 1..open + 1 + i].rsplit('\n').next().unwrap_or_default();
                        if !line.trim_start().starts_with('#') && !line.contains("::") {
                            fields += 1;
                        }
                        line_start = false;
                    }
                    _ => {}
                }
            }
            if fields > 15 && !STORED.contains(&name.as_str()) {
                wide.push(format!("{}: {name} ({fields} fields)", file.display()));
            }
        }
    }
    assert!(wide.is_empty(), "structs over 15 fields: {wide:?}");
}

/// The methods each file adds to each type (`impl Type { fn ... }`, and
/// `impl Trait for Type`), and the `self.` calls each of its methods makes.
fn methods_by_type(text: &str) -> Vec<(String, Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("\nimpl") {
        rest = &rest[at + 5..];
        let Some(open) = rest.find('{') else { break };
        let header = rest[..open].split(" where ").next().unwrap_or_default().trim();
        // Past the impl's own generic parameters, to the type it is for.
        let header = match header.strip_prefix('<') {
            Some(params) => {
                let mut depth = 1;
                let end = params
                    .char_indices()
                    .find(|(_, c)| {
                        match c {
                            '<' => depth += 1,
                            '>' => depth -= 1,
                            _ => {}
                        }
                        depth == 0
                    })
                    .map_or(params.len(), |(i, _)| i + 1);
                &params[end..]
            }
            None => header,
        };
        let target = header.rsplit(" for ").next().unwrap_or(header).trim();
        let path = target.split('<').next().unwrap_or_default();
        let name = path.rsplit("::").next().unwrap_or_default().trim().to_owned();
        let end = closing_brace(rest, open).unwrap_or(rest.len());
        let body = &rest[open..end];
        let defined = body
            .split("fn ")
            .skip(1)
            .map(|f| f.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
            .collect();
        let called = body
            .split("self.")
            .skip(1)
            .filter_map(|c| {
                let name: String = c.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                let after = &c[name.len()..];
                (after.starts_with('(') || after.starts_with("::<")).then_some(name)
            })
            .collect();
        out.push((name, defined, called));
        rest = &rest[end..];
    }
    out
}

/// A type whose methods are spread over files is still one type: no two
/// of those files call each other's methods both ways, or neither can be
/// read without the other. One calls down; the shared state a lower one
/// needs is its own type's.
#[test]
fn no_two_files_of_one_type_call_each_other() {
    let files = library_files();
    // (type, file) -> (methods it defines there, methods its code there calls)
    let mut by: BTreeMap<(String, PathBuf), (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for file in &files {
        let text = without_tests(&std::fs::read_to_string(src().join(file)).unwrap());
        for (ty, defined, called) in methods_by_type(&format!("\n{text}")) {
            let entry = by.entry((ty, file.clone())).or_default();
            entry.0.extend(defined);
            entry.1.extend(called);
        }
    }
    let mut mutual = Vec::new();
    for ((ty, a), (a_defines, a_calls)) in &by {
        for ((ty_b, b), (b_defines, b_calls)) in &by {
            if ty != ty_b || a >= b {
                continue;
            }
            let a_to_b: Vec<_> =
                a_calls.intersection(b_defines).filter(|m| !a_defines.contains(*m)).collect();
            let b_to_a: Vec<_> =
                b_calls.intersection(a_defines).filter(|m| !b_defines.contains(*m)).collect();
            if !a_to_b.is_empty() && !b_to_a.is_empty() {
                mutual.push(format!("{ty}: {} {a_to_b:?} <-> {} {b_to_a:?}", a.display(), b.display()));
            }
        }
    }
    assert!(mutual.is_empty(), "files of one type that call each other both ways:\n{}", mutual.join("\n"));
}

/// The library's face is what its users need: every public module of
/// lib.rs is named by the binary, the bench or the tests; the rest are the
/// crate's own. Within a public module, an item no user can reach is not
/// `pub` either: the compiler says so (`unreachable_pub`, an error in CI's
/// clippy run).
#[test]
fn every_public_module_is_used_from_outside() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    assert!(lib.contains("#![warn(unreachable_pub)]"), "lib.rs no longer warns of unreachable pub items");
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.ends_with("target") && !path.ends_with("node_modules") {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut users = Vec::new();
    for dir in ["src/bin", "bench", "tests", "testkit", "examples"] {
        walk(&root.join(dir), &mut users);
    }
    // The first segment of every path that starts at `hourglass::`, in a
    // `use` group or inline.
    let mut named = BTreeSet::new();
    for file in users {
        let text = code_of(&std::fs::read_to_string(&file).unwrap());
        let mut rest = text.as_str();
        while let Some(at) = rest.find("hourglass::") {
            rest = &rest[at + "hourglass::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let (mut depth, mut top, mut start) = (0, Vec::new(), 0);
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            top.push(&group[start..i]);
                            break;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            top.push(&group[start..i]);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                named.extend(top.iter().map(|p| first_segment(p.trim())));
            } else {
                named.insert(first_segment(rest));
            }
        }
    }
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let unused: Vec<_> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .filter(|m| !named.contains(*m))
        .collect();
    assert!(unused.is_empty(), "lib.rs makes modules public that nothing outside uses: {unused:?}");
}

#[test]
fn store_files_below_the_handle_do_not_reach_back_into_it() {
    // The handle (store/mod.rs) and the files that add its methods
    // (writer, read, scan) may use each other; the codecs, options, errors
    // and health below them may not use the handle or those files.
    for file in ["schema", "view", "options", "error", "health", "claims", "verify"] {
        // A file, or a folder whose mod.rs is the room's top (its other
        // files' `super::` is that room, not the store).
        let path = src().join(format!("store/{file}.rs"));
        let path = if path.exists() { path } else { src().join(format!("store/{file}/mod.rs")) };
        let text = std::fs::read_to_string(&path).unwrap();
        let used = paths_after(&without_tests(&text), "super::");
        for above in ["Store", "writer", "read", "scan"] {
            assert!(!used.contains(above), "store/{file}.rs reaches back into the store ({above}): {used:?}");
        }
    }
}
