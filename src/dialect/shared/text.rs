//! The text a model reads in a block or item the neutral form has no shape for.

use serde_json::Value;

/// The strings of `v` a model reads (those under a key in `not_text`, such as ids, signatures and encrypted or
/// base64 data, skipped), in document order, joined by newlines. Walks with an explicit stack: no recursion on
/// deep values.
pub fn opaque_text(v: &Value, not_text: &[&str]) -> String {
    let mut out = String::new();
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if !s.is_empty() => {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(s);
            }
            Value::Array(a) => stack.extend(a.iter().rev()),
            Value::Object(o) => stack.extend(
                o.iter()
                    .rev()
                    .filter(|(k, _)| !not_text.contains(&k.as_str()))
                    .map(|(_, v)| v),
            ),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_strings_in_document_order_and_skips_the_named_keys() {
        let v =
            json!({"type":"x","a":"one","b":[{"id":"i","c":"two"},"three"],"sig":"s","n":3,"e":""});
        assert_eq!(opaque_text(&v, &["type", "id", "sig"]), "one\ntwo\nthree");
        assert_eq!(opaque_text(&v, &[]), "x\none\ni\ntwo\nthree\ns");
    }
}
