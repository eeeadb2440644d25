//! The layers keep their order: the driver's shell files and the web page import one another
//! without a circle, and the executor, the protocol and the listener bus never reach up into the
//! driver or the command line. Read from the sources under `src/`, so a change that breaks a
//! layer fails here, at once, with the files that break it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// `src/` of this crate.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, at any depth.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The code of `path` without comments, and without its unit tests (everything from the first
/// `#[cfg(test)]` on: in a test module `super::` names the file itself).
fn code(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segments of the paths that follow each `prefix` in `code`: `super::core::Core`
/// gives `core`, and `super::{core::Core, lease}` gives `core` and `lease`.
fn named_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // A group: each top-level item's first segment.
            let (mut depth, mut item, mut items) = (0, String::new(), Vec::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    _ => {}
                }
                item.push(c);
            }
            items.push(item);
            for item in items {
                let item = item.trim_start_matches(',').trim();
                names.insert(first_segment(item));
            }
        } else {
            names.insert(first_segment(rest));
        }
    }
    names.retain(|name| !name.is_empty() && name != "self" && name != "*");
    names
}

fn first_segment(path: &str) -> String {
    path.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The driver's modules (each file of `src/driver/`, and `core` as one) and `web`, each with
/// the others it names.
fn shell_imports() -> BTreeMap<String, BTreeSet<String>> {
    let driver = src().join("driver");
    let mut modules = BTreeSet::new();
    for entry in fs::read_dir(&driver).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if name != "mod" {
            modules.insert(name);
        }
    }
    let mut imports = BTreeMap::new();
    for name in &modules {
        let file = driver.join(format!("{name}.rs"));
        if !file.is_file() {
            // A module that is a folder (the core) imports nothing of the shell: checked below.
            imports.insert(name.clone(), BTreeSet::new());
            continue;
        }
        let code = code(&file);
        let mut named = named_after(&code, "super::");
        named.extend(named_after(&code, "crate::driver::"));
        named.retain(|n| modules.contains(n) && n != name);
        if named_after(&code, "crate::").contains("web") {
            named.insert("web".into());
        }
        imports.insert(name.clone(), named);
    }
    let mut web = BTreeSet::new();
    for file in rust_files(&src().join("web")) {
        let named = named_after(&code(&file), "crate::driver::");
        web.extend(named.into_iter().filter(|n| modules.contains(n)));
    }
    imports.insert("web".into(), web);
    imports
}

/// A circle in `imports`, as the modules along it, if there is one.
fn circle(imports: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        imports: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(from) = path.iter().position(|p| p == at) {
            let mut circle = path[from..].to_vec();
            circle.push(at.to_string());
            return Some(circle);
        }
        if !done.insert(at.to_string()) {
            return None;
        }
        path.push(at.to_string());
        for next in imports.get(at).into_iter().flatten() {
            if let Some(circle) = visit(next, imports, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    imports
        .keys()
        .find_map(|start| visit(start, imports, &mut Vec::new(), &mut done))
}

#[test]
fn the_driver_shell_and_the_web_page_import_one_another_without_a_circle() {
    let imports = shell_imports();
    assert!(
        imports.len() > 10,
        "the driver's modules were not found: {imports:?}"
    );
    if let Some(circle) = circle(&imports) {
        panic!(
            "an import circle among src/driver/*.rs and src/web/: {}",
            circle.join(" -> ")
        );
    }
}

#[test]
fn the_web_page_asks_the_driver_and_reads_neither_its_core_nor_its_results() {
    for file in rust_files(&src().join("web")) {
        let named = named_after(&code(&file), "crate::driver::");
        assert!(
            named.is_empty(),
            "{} imports crate::driver::{{{}}}; the page asks the driver over its link",
            file.display(),
            named.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
}

#[test]
fn the_core_imports_nothing_of_the_shell_the_metrics_or_the_web_page() {
    // The core's own files; its unit tests (`core/tests/`) may use anything.
    let core = src().join("driver").join("core");
    let files = rust_files(&core)
        .into_iter()
        .filter(|file| file.parent() == Some(core.as_path()));
    for file in files {
        let code = code(&file);
        let named = named_after(&code, "crate::");
        for above in ["metrics", "web", "cli", "connect", "executor"] {
            assert!(
                !named.contains(above),
                "{} imports crate::{above}",
                file.display()
            );
        }
        let shell = named_after(&code, "crate::driver::");
        assert!(
            shell.iter().all(|n| n == "core"),
            "{} imports the driver's shell: crate::driver::{shell:?}",
            file.display()
        );
        assert!(
            !code.contains("super::super::"),
            "{} reaches above the core with super::super::",
            file.display()
        );
    }
}

#[test]
fn the_executor_the_protocol_and_the_listener_bus_do_not_reach_up() {
    let root = src();
    let mut files = rust_files(&root.join("executor"));
    files.extend(rust_files(&root.join("protocol")));
    files.push(root.join("protocol.rs"));
    files.push(root.join("events.rs"));
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        let text: String = text
            .lines()
            .map(|line| line.split("//").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        let named = named_after(&text, "crate::");
        for above in ["driver", "cli"] {
            assert!(
                !named.contains(above),
                "{} imports crate::{above}, a layer above it",
                file.display()
            );
        }
    }
}

#[test]
fn the_architecture_map_names_every_file_under_src() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let map = fs::read_to_string(root.join("docs").join("architecture.md")).unwrap();
    let mut missing = Vec::new();
    for file in rust_files(&src()) {
        let path = file
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        // The files of a folder of tests are named by the folder.
        let named = match path.find("/tests/") {
            Some(at) => path[..at + "/tests/".len()].to_string(),
            None => path.clone(),
        };
        if !map.contains(&format!("`{named}`")) {
            missing.push(named);
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "docs/architecture.md's map of the source does not name: {missing:?}"
    );
}

#[test]
fn the_reader_finds_what_it_looks_for() {
    let code = "use super::{core::{Core, Effect}, lease};\nuse super::journal::Journal;\n\
                let x = crate::driver::shell::Shell;";
    assert_eq!(
        named_after(code, "super::"),
        ["core", "journal", "lease"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    assert_eq!(
        named_after(code, "crate::driver::"),
        BTreeSet::from(["shell".to_string()])
    );
    let mut imports = BTreeMap::new();
    imports.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    imports.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        circle(&imports),
        Some(vec!["a".to_string(), "b".to_string(), "a".to_string()])
    );
    imports.get_mut("b").unwrap().clear();
    assert_eq!(circle(&imports), None);
}
