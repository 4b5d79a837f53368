//! The library's module graph: no import cycle, and the layers hold.
//!
//! Reads `src/` as text (no compiler plugin, no extra tool): every `use`
//! and every inline `crate::…` / `super::…` path of non-test code, each
//! resolved to the module that *defines* the item (a `use` re-export is an
//! alias, not a dependency). An edge A → B means code in A needs a
//! definition in B. The test fails on:
//!
//! - any cycle among modules (files);
//! - a ground-floor module (error, options, types, settings, key, redact,
//!   fence)
//!   needing anything above it;
//! - `core` needing a backend or the facade (locker, builder);
//! - a backend needing another backend or the facade;
//! - anything but the crate root needing the facade.
//!
//! So adding a backend means one folder implementing `core::backend::Backend`,
//! plus one line in `builder.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

type ModPath = Vec<String>;

struct Module {
    file: PathBuf,
    /// Items defined here (functions, types, constants, macros).
    defines: BTreeSet<String>,
    /// Child modules declared here.
    children: BTreeSet<String>,
    /// `use` aliases: the name in scope → the path it stands for (absolute,
    /// or relative to this module's parent / itself as written).
    aliases: HashMap<String, ModPath>,
    /// Every path this module's code refers to, made absolute.
    refs: Vec<ModPath>,
}

fn module_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_owned()),
    }
    parts
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without comments, string literals and its test module.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        // A test module (`#[cfg(test)]`, `#[cfg(all(test, …))]`) ends the code.
        let test_mod = line.starts_with("#[cfg(")
            && line.contains("test")
            && lines[i + 1..].iter().take(2).any(|l| l.starts_with("mod "));
        if test_mod {
            break;
        }
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        // Drops string literals (they may hold `crate::` in messages).
        let mut in_str = false;
        let mut prev = ' ';
        for c in line.chars() {
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            } else if !in_str {
                out.push(c);
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
        }
        out.push('\n');
    }
    out
}

fn ident_at(s: &str) -> Option<(&str, &str)> {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (end > 0).then(|| (&s[..end], &s[end..]))
}

/// Expands a `use` tree (`a::b::{c, d::e as f, self}`) into (alias, path).
fn expand_use(tree: &str, prefix: &ModPath, out: &mut Vec<(String, ModPath)>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head: ModPath = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let mut base = prefix.clone();
        base.extend(head);
        let inner = &tree[open + 1..tree.rfind('}').unwrap()];
        let (mut depth, mut start) = (0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand_use(&inner[start..], &base, out);
        return;
    }
    if tree.is_empty() || tree.ends_with('*') {
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim())),
        None => (tree, None),
    };
    let mut full = prefix.clone();
    full.extend(path.split("::").map(|s| s.trim().to_owned()));
    if full.last().is_some_and(|l| l == "self") {
        full.pop();
    }
    let name = alias.map(str::to_owned).or_else(|| full.last().cloned());
    if let Some(name) = name.filter(|n| n != "_") {
        out.push((name, full));
    }
}

/// Makes a written path absolute from module `at`; `None` for other crates.
fn absolute(path: &[String], at: &ModPath, children: &BTreeSet<String>) -> Option<ModPath> {
    let first = path.first()?;
    match first.as_str() {
        "crate" => Some(path[1..].to_vec()),
        "super" | "self" => {
            let mut base = at.clone();
            let mut rest = path;
            while let Some(s) = rest.first() {
                match s.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            Some(base)
        }
        s if children.contains(s) => {
            let mut base = at.clone();
            base.extend(path.iter().cloned());
            Some(base)
        }
        _ => None,
    }
}

fn parse(src: &Path, file: &Path) -> (ModPath, Module) {
    let at = module_path(src, file);
    let code = code_of(&std::fs::read_to_string(file).unwrap());
    let mut m = Module {
        file: file.to_owned(),
        defines: BTreeSet::new(),
        children: BTreeSet::new(),
        aliases: HashMap::new(),
        refs: Vec::new(),
    };
    // Definitions and child modules.
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '!'))
        .filter(|w| !w.is_empty())
        .collect();
    for w in words.windows(2) {
        match w[0] {
            "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" | "macro_rules!" => {
                m.defines.insert(w[1].trim_end_matches('!').to_owned());
            }
            "mod" => {
                m.children.insert(w[1].to_owned());
            }
            _ => {}
        }
    }
    // `use` statements.
    let mut uses = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().last();
        let after = &rest[i + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            rest = after;
            continue;
        }
        let end = after.find(';').unwrap_or(after.len());
        expand_use(&after[..end], &Vec::new(), &mut uses);
        rest = &after[end..];
    }
    for (alias, path) in uses {
        if let Some(abs) = absolute(&path, &at, &m.children) {
            m.refs.push(abs.clone());
            m.aliases.insert(alias, abs);
        }
    }
    // Inline paths: `crate::a::b`, `super::x`, `child::x`.
    let anchors: Vec<String> = ["crate", "super"]
        .iter()
        .map(|s| s.to_string())
        .chain(m.children.iter().cloned())
        .map(|s| s + "::")
        .collect();
    for anchor in &anchors {
        let anchor = anchor.as_str();
        let mut rest = code.as_str();
        while let Some(i) = rest.find(anchor) {
            let before = rest[..i].chars().last();
            let mut s = &rest[i..];
            rest = &rest[i + anchor.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let mut path = Vec::new();
            while let Some((id, after)) = ident_at(s) {
                path.push(id.to_owned());
                match after.strip_prefix("::") {
                    Some(a) if !a.starts_with('{') => s = a,
                    _ => break,
                }
            }
            // `crate::{…}` is a `use` group, read above.
            if path.len() < 2 {
                continue;
            }
            if let Some(abs) = absolute(&path, &at, &m.children) {
                m.refs.push(abs);
            }
        }
    }
    (at, m)
}

/// The module that defines what `path` names.
fn resolve(mods: &BTreeMap<ModPath, Module>, path: &[String], depth: usize) -> ModPath {
    let mut cur: ModPath = Vec::new();
    for (i, seg) in path.iter().enumerate() {
        let m = &mods[&cur];
        if m.children.contains(seg) && mods.contains_key(&[cur.clone(), vec![seg.clone()]].concat()) {
            cur.push(seg.clone());
            continue;
        }
        if m.defines.contains(seg) {
            return cur;
        }
        if let Some(target) = m.aliases.get(seg) {
            if depth < 16 && target.as_slice() != &path[..=i] {
                let mut full = target.clone();
                full.extend(path[i + 1..].iter().cloned());
                return resolve(mods, &full, depth + 1);
            }
        }
        return cur;
    }
    cur
}

fn name(p: &ModPath) -> String {
    if p.is_empty() {
        "(root)".into()
    } else {
        p.join("::")
    }
}

fn layer(p: &ModPath) -> &'static str {
    match p.first().map(String::as_str) {
        None => "root",
        Some("error" | "options" | "types" | "settings" | "key" | "redact" | "fence" | "runs" | "delay") => {
            "ground"
        }
        Some("core") => "core",
        Some("locker" | "builder" | "slots" | "once") => "facade",
        Some(_) => "backend",
    }
}

#[test]
fn the_module_graph_has_no_cycle_and_keeps_its_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mods: BTreeMap<ModPath, Module> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "tests.rs"))
        .map(|f| parse(&src, f))
        .collect();
    assert!(mods.len() > 30, "found only {} modules", mods.len());

    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (at, m) in &mods {
        for r in &m.refs {
            let to = resolve(&mods, r, 0);
            if &to != at {
                edges.entry(at.clone()).or_default().insert(to);
            }
        }
    }

    let mut problems = Vec::new();
    for (from, tos) in &edges {
        for to in tos {
            let (lf, lt) = (layer(from), layer(to));
            let bad = match (lf, lt) {
                (_, "root") => from.first().is_some_and(|f| f != "locker" && f != "builder"),
                ("ground", "core" | "backend" | "facade") => true,
                ("core", "backend" | "facade") => true,
                ("backend", "facade") => true,
                ("backend", "backend") => from[0] != to[0],
                _ => false,
            };
            if bad {
                problems.push(format!("layer: {} ({lf}) needs {} ({lt})", name(from), name(to)));
            }
        }
    }

    // Cycles: Tarjan's strongly connected components.
    struct Tarjan<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: HashMap<ModPath, usize>,
        low: HashMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on: BTreeSet<ModPath>,
        next: usize,
        sccs: Vec<Vec<ModPath>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: &ModPath) {
            self.index.insert(v.clone(), self.next);
            self.low.insert(v.clone(), self.next);
            self.next += 1;
            self.stack.push(v.clone());
            self.on.insert(v.clone());
            let edges = self.edges;
            for w in edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on.remove(&w);
                    let done = &w == v;
                    scc.push(w);
                    if done {
                        break;
                    }
                }
                if scc.len() > 1 {
                    self.sccs.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges: &edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        sccs: Vec::new(),
    };
    for v in mods.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    for scc in &t.sccs {
        let members: Vec<String> = scc.iter().map(name).collect();
        let inner: Vec<String> = scc
            .iter()
            .flat_map(|a| {
                edges[a]
                    .iter()
                    .filter(|b| scc.contains(b))
                    .map(move |b| format!("{} -> {}", name(a), name(b)))
            })
            .collect();
        problems.push(format!(
            "cycle among {}: {}",
            members.join(", "),
            inner.join("; ")
        ));
    }

    // The graph is not empty: the parser found the edges it should.
    let has = |a: &[&str], b: &[&str]| {
        let a: ModPath = a.iter().map(|s| s.to_string()).collect();
        let b: ModPath = b.iter().map(|s| s.to_string()).collect();
        edges.get(&a).is_some_and(|t| t.contains(&b))
    };
    assert!(
        has(&["core", "pipeline"], &["core", "backend"]),
        "parser lost an edge"
    );
    assert!(has(&["local"], &["core", "backend"]), "parser lost an edge");
    assert!(has(&["builder"], &["core", "pipeline"]), "parser lost an edge");

    assert!(
        problems.is_empty(),
        "{} problem(s) in the module graph:\n{}\n(files: {})",
        problems.len(),
        problems.join("\n"),
        mods.values()
            .map(|m| m.file.strip_prefix(&src).unwrap().display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
}

#[test]
fn use_trees_expand() {
    let mut out = Vec::new();
    expand_use("crate::a::{b, c::{d as e, self}, f::*}", &Vec::new(), &mut out);
    let got: Vec<(String, String)> = out.into_iter().map(|(n, p)| (n, p.join("::"))).collect();
    assert_eq!(
        got,
        [
            ("b".to_string(), "crate::a::b".to_string()),
            ("e".to_string(), "crate::a::c::d".to_string()),
            ("c".to_string(), "crate::a::c".to_string()),
        ]
    );
}

/// Files stay readable: none in `src/` passes 500 lines (tests included). (400
/// until the fleet round; four files grew past it and are to be split by concern.)
#[test]
fn no_source_file_passes_500_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > 500).then(|| format!("{} ({n} lines)", f.strip_prefix(&src).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "split these by concern: {long:?}");
}

/// The top-level modules (a folder is one module): no circle among them
/// either, so that `types.rs` and `redact/` (say) do not lean on each other
/// through different files.
#[test]
fn no_circle_among_top_level_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mods: BTreeMap<ModPath, Module> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "tests.rs"))
        .map(|f| parse(&src, f))
        .collect();
    let top = |p: &ModPath| p.first().cloned().unwrap_or_else(|| "(root)".into());
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (at, m) in &mods {
        for r in &m.refs {
            let (from, to) = (top(at), top(&resolve(&mods, r, 0)));
            if from != to {
                edges.entry(from).or_default().insert(to);
            }
        }
    }
    // A circle is a pair of modules that reach each other.
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for n in edges.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let mut circles = Vec::new();
    for a in edges.keys() {
        for b in reach(a) {
            if a < &b && reach(&b).contains(a) {
                circles.push(format!("{a} <-> {b}"));
            }
        }
    }
    assert!(
        edges.get("core").is_some_and(|t| t.contains("types")),
        "parser lost an edge"
    );
    assert!(circles.is_empty(), "top-level modules in a circle: {circles:?}");
}

/// Backends are named only in their own folder and the tables that list
/// every backend: the scheme and capability table (`types.rs`), the key
/// scheme (`key/`), the URL syntax per scheme (`redact/`), the builder's
/// URL dispatch and the crate root's re-exports. The core, the facade and
/// the features composed on it (slots, once-per, runs, fencing) name none.
/// (`error.rs` names the drivers only to read an error's SQLSTATE.)
#[test]
fn no_backend_is_named_outside_its_folder_and_the_tables() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    // A backend is a folder with an `impl Backend for` in it.
    let backends: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let mut inside = Vec::new();
            if path.is_dir() {
                rs_files(&path, &mut inside);
            }
            let implements = inside
                .iter()
                .any(|f| std::fs::read_to_string(f).unwrap().contains("impl Backend for "));
            implements.then(|| path.file_name().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    assert!(backends.len() >= 3, "found backends {backends:?}");
    let tables = ["types.rs", "key", "redact", "builder.rs", "lib.rs"];
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel.iter().next().unwrap().to_string_lossy().into_owned();
        if backends.contains(&first) || tables.contains(&first.as_str()) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        for b in &backends {
            let variant = {
                let mut c = b.chars();
                c.next()
                    .map(|h| h.to_uppercase().chain(c).collect::<String>())
                    .unwrap_or_default()
            };
            for needle in [
                format!("crate::{b}::"),
                format!("super::{b}::"),
                format!("BackendKind::{variant}"),
            ] {
                if code.contains(&needle) {
                    found.push(format!("{} names {needle}", rel.display()));
                }
            }
        }
    }
    assert!(found.is_empty(), "backend names outside their folders: {found:?}");
}
