//! results.json and `iperf3 -J` through serde_json, with two conveniences the bench uses
//! everywhere: building an object key by key ([`ValueExt::set`]) and following a path of keys
//! ([`ValueExt::path`]). Objects keep insertion order (serde_json's `preserve_order`), so
//! results.json reads top-down like the report.

pub use serde_json::Value;

/// What the bench adds to [`Value`].
pub trait ValueExt {
    /// An empty object.
    fn obj() -> Value;
    /// Adds (or replaces) `key` in an object; a no-op on other values.
    fn set(&mut self, key: &str, v: impl Into<Value>) -> &mut Value;
    /// Follows a path of object keys.
    fn path(&self, keys: &[&str]) -> Option<&Value>;
    /// Indented text, for results.json.
    fn pretty(&self) -> String;
    /// Parses JSON text (iperf3's output, a results.json).
    fn parse(text: &str) -> Result<Value, String>;
}

impl ValueExt for Value {
    fn obj() -> Value {
        Value::Object(serde_json::Map::new())
    }

    fn set(&mut self, key: &str, v: impl Into<Value>) -> &mut Value {
        if let Value::Object(m) = self {
            m.insert(key.to_string(), v.into());
        }
        self
    }

    fn path(&self, keys: &[&str]) -> Option<&Value> {
        keys.iter().try_fold(self, |v, k| v.get(k))
    }

    fn pretty(&self) -> String {
        // Serializing a Value cannot fail: its keys are strings.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    fn parse(text: &str) -> Result<Value, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_nested_values_in_insertion_order() {
        let mut v = Value::obj();
        v.set("b", 1.5)
            .set("a", "x\"y")
            .set("c", Value::Array(vec![Value::Null, true.into()]));
        let text = v.pretty();
        assert_eq!(Value::parse(&text).expect("parses"), v);
        assert!(text.find("\"b\"") < text.find("\"a\""), "{text}");
        v.set("b", 2u64);
        assert_eq!(v.get("b").and_then(Value::as_u64), Some(2));
        assert_eq!(v.as_object().map(serde_json::Map::len), Some(3));
    }

    #[test]
    fn reads_iperf3_style_numbers_and_paths() {
        let v = Value::parse(
            r#"{"end": {"sum": {"jitter_ms": 0.0123, "lost_percent": 0, "e": -1.5e3}}}"#,
        )
        .expect("parses");
        assert_eq!(
            v.path(&["end", "sum", "jitter_ms"]).and_then(Value::as_f64),
            Some(0.0123)
        );
        assert_eq!(
            v.path(&["end", "sum", "e"]).and_then(Value::as_f64),
            Some(-1500.0)
        );
        assert!(Value::parse("{\"a\": }").is_err());
    }
}
