//! One result row per scenario, as a JSON line or a table line.

use serde_json::{json, Map, Value};

use crate::stats::Latencies;

/// The result of one scenario run.
#[derive(Debug)]
pub struct Row {
    /// Scenario name (`floor`, `uncontended`, ...).
    pub scenario: &'static str,
    /// `postgres`, `mysql` or `local`.
    pub backend: &'static str,
    /// Concurrent clients (tasks or connections).
    pub clients: usize,
    /// Operations completed (lock cycles, acquisitions, round trips).
    pub ops: u64,
    /// Wall time the operations took.
    pub seconds: f64,
    /// Median latency of one operation.
    pub p50_us: Option<u32>,
    /// 99th-percentile latency of one operation.
    pub p99_us: Option<u32>,
    /// Server connections the scenario used, counted on the server.
    pub connections: Option<i64>,
    /// Scenario-specific fields, in insertion order of [`Row::set`].
    pub extra: Map<String, Value>,
}

impl Row {
    /// A row with latencies taken from `lat`.
    pub fn new(
        scenario: &'static str,
        backend: &'static str,
        clients: usize,
        mut lat: Latencies,
        seconds: f64,
    ) -> Self {
        let (p50_us, p99_us) = lat.p50_p99().unzip();
        Row {
            scenario,
            backend,
            clients,
            ops: lat.len() as u64,
            seconds,
            p50_us,
            p99_us,
            connections: None,
            extra: Map::new(),
        }
    }

    /// Operations per second.
    pub fn ops_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// Adds a scenario-specific field.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) {
        self.extra.insert(key.to_owned(), value.into());
    }

    /// The row as one JSON object (common fields first).
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "scenario": self.scenario,
            "backend": self.backend,
            "clients": self.clients,
            "ops": self.ops,
            "seconds": round(self.seconds, 4),
            "ops_per_s": round(self.ops_per_s(), 1),
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "connections": self.connections,
        });
        if let Value::Object(m) = &mut v {
            m.extend(self.extra.clone());
        }
        v
    }

    /// The table header matching [`Row::table_line`].
    pub fn table_header() -> String {
        format!(
            "{:<12} {:>7} {:>9} {:>11} {:>8} {:>8} {:>5}  notes",
            "scenario", "clients", "ops", "ops/s", "p50 µs", "p99 µs", "conns"
        )
    }

    /// The row as one human-readable line.
    pub fn table_line(&self) -> String {
        let opt = |v: Option<u32>| v.map_or("-".to_owned(), |v| v.to_string());
        let notes: Vec<String> = self
            .extra
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                v => format!("{k}={v}"),
            })
            .collect();
        format!(
            "{:<12} {:>7} {:>9} {:>11.1} {:>8} {:>8} {:>5}  {}",
            self.scenario,
            self.clients,
            self.ops,
            self.ops_per_s(),
            opt(self.p50_us),
            opt(self.p99_us),
            self.connections.map_or("-".to_owned(), |c| c.to_string()),
            notes.join(" ")
        )
    }
}

/// `x` rounded to `digits` decimals, for readable JSON.
pub fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}
