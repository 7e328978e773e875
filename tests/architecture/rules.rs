//! The rules block of ARCHITECTURE.md (which top-level modules each one may import) and the checks against it:
//! every use allowed, every module ruled, no cycle between top-level modules.

use super::scan::{Crate, Edge};
use std::collections::{BTreeMap, BTreeSet};

/// The fence that opens the rules block in ARCHITECTURE.md.
pub const FENCE: &str = "```text rules";

/// Module → the modules it may import.
pub type Rules = BTreeMap<String, BTreeSet<String>>;

/// Parses the rules block of `doc`: lines `module: dep dep …` (an empty list: imports nothing of ours), `#`
/// comments and blank lines ignored.
pub fn parse(doc: &str) -> Result<Rules, String> {
    let start = doc
        .find(FENCE)
        .ok_or_else(|| format!("no `{FENCE}` block in ARCHITECTURE.md"))?;
    let body = &doc[start + FENCE.len()..];
    let end = body
        .find("\n```")
        .ok_or_else(|| "the rules block is not closed".to_string())?;
    let mut rules = Rules::new();
    for (n, line) in body[..end].lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (module, deps) = line
            .split_once(':')
            .ok_or_else(|| format!("rules line {n}: `{line}` is not `module: deps`"))?;
        let deps = deps.split_whitespace().map(str::to_string).collect();
        if rules.insert(module.trim().to_string(), deps).is_some() {
            return Err(format!("rules: `{}` is ruled twice", module.trim()));
        }
    }
    Ok(rules)
}

/// Every problem of `krate` against `rules`, one message each: modules without a rule (or rules naming no
/// module), uses the rules do not allow, and cycles between top-level modules.
pub fn check(krate: &Crate, rules: &Rules) -> Vec<String> {
    let mut problems: Vec<String> = krate
        .missing
        .iter()
        .map(|m| format!("{m}: declared module file not found"))
        .collect();
    let modules: BTreeSet<&String> = krate.modules.iter().collect();
    for m in &modules {
        if !rules.contains_key(*m) {
            problems.push(format!(
                "src/{m}: module `{m}` has no line in ARCHITECTURE.md's rules block"
            ));
        }
    }
    for (m, deps) in rules {
        for name in std::iter::once(m).chain(deps) {
            if !modules.contains(name) {
                problems.push(format!(
                    "ARCHITECTURE.md rules: `{name}` (in `{m}`'s line) is no module of the crate"
                ));
            }
        }
    }
    for e in &krate.edges {
        let allowed = rules.get(&e.from);
        if allowed.is_some_and(|a| !a.contains(&e.to)) {
            let list: Vec<&str> = allowed.into_iter().flatten().map(String::as_str).collect();
            problems.push(format!(
                "{}:{}: `{}` uses `crate::{}`, which ARCHITECTURE.md's rules do not allow (`{}` may use: {})",
                e.file,
                e.line,
                e.from,
                e.to,
                e.from,
                if list.is_empty() { "nothing of ours".to_string() } else { list.join(" ") }
            ));
        }
    }
    let graph: BTreeMap<&str, BTreeMap<&str, &Edge>> =
        krate.edges.iter().fold(BTreeMap::new(), |mut g, e| {
            g.entry(e.from.as_str())
                .or_default()
                .entry(e.to.as_str())
                .or_insert(e);
            g
        });
    for (cycle, knot) in cycles(&graph).into_iter().zip(knots(&graph)) {
        let steps: Vec<String> = cycle
            .windows(2)
            .map(|w| {
                let e = graph[w[0].as_str()][w[1].as_str()];
                format!("{} -> {} at {}:{}", e.from, e.to, e.file, e.line)
            })
            .collect();
        problems.push(format!(
            "cycle between top-level modules {}: {} (all tied together: {})",
            cycle.join(" -> "),
            steps.join("; "),
            knot.join(" ")
        ));
    }
    for cycle in rule_cycles(rules) {
        problems.push(format!(
            "ARCHITECTURE.md rules allow a cycle: {}",
            cycle.join(" -> ")
        ));
    }
    problems
}

/// One cycle per strongly connected component of more than one module (Tarjan), each as a closed walk
/// `[a, b, …, a]` found by a breadth-first search inside its component.
pub fn cycles<V>(graph: &BTreeMap<&str, BTreeMap<&str, V>>) -> Vec<Vec<String>> {
    components(graph)
        .into_iter()
        .map(|c| walk_back(&c, graph))
        .collect()
}

/// The modules of each strongly connected component of more than one module, in the order of [`cycles`].
pub fn knots<V>(graph: &BTreeMap<&str, BTreeMap<&str, V>>) -> Vec<Vec<String>> {
    components(graph)
        .into_iter()
        .map(|c| c.into_iter().map(str::to_string).collect())
        .collect()
}

fn components<'a, V>(graph: &BTreeMap<&'a str, BTreeMap<&'a str, V>>) -> Vec<BTreeSet<&'a str>> {
    let nodes: BTreeSet<&str> = graph
        .iter()
        .flat_map(|(a, to)| std::iter::once(*a).chain(to.keys().copied()))
        .collect();
    let mut t = Tarjan::default();
    for n in &nodes {
        if !t.index.contains_key(n) {
            t.visit(n, graph);
        }
    }
    t.components.into_iter().filter(|c| c.len() > 1).collect()
}

/// The shortest closed walk from the component's first module back to itself, staying inside it.
fn walk_back<V>(
    component: &BTreeSet<&str>,
    graph: &BTreeMap<&str, BTreeMap<&str, V>>,
) -> Vec<String> {
    let start = component.iter().next().copied().unwrap_or_default();
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(n) = queue.pop_front() {
        for next in graph.get(n).into_iter().flat_map(|to| to.keys().copied()) {
            if !component.contains(next) {
                continue;
            }
            if next == start {
                let mut walk = vec![start.to_string()];
                let mut at = n;
                while at != start {
                    walk.push(at.to_string());
                    at = prev[at];
                }
                walk.push(start.to_string());
                walk.reverse();
                return walk;
            }
            if !prev.contains_key(next) {
                prev.insert(next, n);
                queue.push_back(next);
            }
        }
    }
    component.iter().map(|s| s.to_string()).collect()
}

#[derive(Default)]
struct Tarjan<'a> {
    index: BTreeMap<&'a str, usize>,
    low: BTreeMap<&'a str, usize>,
    stack: Vec<&'a str>,
    on_stack: BTreeSet<&'a str>,
    components: Vec<BTreeSet<&'a str>>,
}

impl<'a> Tarjan<'a> {
    fn visit<V>(&mut self, v: &'a str, graph: &BTreeMap<&'a str, BTreeMap<&'a str, V>>) {
        let i = self.index.len();
        self.index.insert(v, i);
        self.low.insert(v, i);
        self.stack.push(v);
        self.on_stack.insert(v);
        for w in graph.get(v).into_iter().flat_map(|to| to.keys().copied()) {
            if !self.index.contains_key(w) {
                self.visit(w, graph);
                let lw = self.low[w];
                let lv = self.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if self.on_stack.contains(w) {
                let iw = self.index[w];
                let lv = self.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if self.low[v] == self.index[v] {
            let mut c = BTreeSet::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack.remove(w);
                c.insert(w);
                if w == v {
                    break;
                }
            }
            self.components.push(c);
        }
    }
}

/// The rules themselves must not allow a cycle: each module's allowed list as a graph, checked like the code.
pub fn rule_cycles(rules: &Rules) -> Vec<Vec<String>> {
    let graph: BTreeMap<&str, BTreeMap<&str, ()>> = rules
        .iter()
        .map(|(m, deps)| (m.as_str(), deps.iter().map(|d| (d.as_str(), ())).collect()))
        .collect();
    cycles(&graph)
}
