//! The raw bytes of a JSON body's top-level fields and of an array's elements, found by scanning (strings skipped
//! with `memchr`) instead of deserialising. It cuts; it does not check: a body the scan reads is then parsed piece
//! by piece, or was already parsed whole.

/// Values nested deeper than this are left to serde_json (its own limit, 128, counts from the body's top).
const MAX_DEPTH: usize = 64;

/// A top-level field of a body: its key's text (without its quotes), its value's raw bytes and, for an array the
/// caller asked to split, its elements' raw bytes.
pub struct Field<'a> {
    pub key: &'a [u8],
    pub raw: &'a [u8],
    pub items: Option<Vec<&'a [u8]>>,
}

/// The top-level fields of `body`, in order, the arrays of those for which `split(key)` holds cut into their
/// elements in the same pass. `None` when the body is not one the scan can read surely — not an object, an
/// escaped key or one with a control character, anything unexpected between the values, trailing bytes, values
/// nested too deep.
pub fn fields(body: &[u8], split: impl Fn(&[u8]) -> bool) -> Option<Vec<Field<'_>>> {
    let mut s = Scan { b: body, i: 0 };
    s.ws();
    s.eat(b'{')?;
    let mut out = Vec::new();
    s.ws();
    if s.peek()? == b'}' {
        s.i += 1;
    } else {
        loop {
            s.ws();
            let key = s.string()?;
            let key = &key[1..key.len() - 1];
            if key.iter().any(|&c| c == b'\\' || c < 0x20) {
                return None;
            }
            s.ws();
            s.eat(b':')?;
            s.ws();
            let start = s.i;
            let items = if split(key) && s.peek()? == b'[' {
                Some(s.array()?)
            } else {
                s.value()?;
                None
            };
            out.push(Field {
                key,
                raw: &body[start..s.i],
                items,
            });
            s.ws();
            match s.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
    }
    s.ws();
    (s.i == body.len()).then_some(out)
}

/// The elements of the top-level `"messages"` array of `body`, each exactly as serde_json's `RawValue` gives it
/// (the value's bytes, without the whitespace around it). `None` when the body is not one the scan can read
/// surely (see [`fields`]), has no `messages` array, or has it twice: the caller then asks serde_json.
pub fn messages(body: &[u8]) -> Option<Vec<&[u8]>> {
    let mut found = None;
    for field in fields(body, |k| k == b"messages")? {
        if field.key == b"messages" {
            if found.is_some() {
                return None;
            }
            found = Some(field.items?);
        }
    }
    found
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    /// A string, quotes included; the cursor after its closing quote: the first `"` not escaped, i.e. not after
    /// an odd number of backslashes (only a quote stops the search, not each escape).
    fn string(&mut self) -> Option<&'a [u8]> {
        let start = self.i;
        self.eat(b'"')?;
        loop {
            let at = self.i + memchr::memchr(b'"', &self.b[self.i..])?;
            let backslashes = self.b[start + 1..at]
                .iter()
                .rev()
                .take_while(|&&c| c == b'\\')
                .count();
            self.i = at + 1;
            if backslashes % 2 == 0 {
                return Some(&self.b[start..self.i]);
            }
        }
    }

    /// The elements of an array, each as its raw bytes.
    fn array(&mut self) -> Option<Vec<&'a [u8]>> {
        self.eat(b'[')?;
        let mut out = Vec::new();
        self.ws();
        if self.peek()? == b']' {
            self.i += 1;
            return Some(out);
        }
        loop {
            self.ws();
            out.push(self.value()?);
            self.ws();
            match self.next()? {
                b',' => continue,
                b']' => return Some(out),
                _ => return None,
            }
        }
    }

    /// Any value, skipped; its raw bytes.
    fn value(&mut self) -> Option<&'a [u8]> {
        let start = self.i;
        match self.peek()? {
            b'"' => {
                self.string()?;
            }
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => {
                            depth += 1;
                            if depth > MAX_DEPTH {
                                return None;
                            }
                        }
                        b'}' | b']' => {
                            depth = depth.checked_sub(1)?;
                            if depth == 0 {
                                self.i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                while !matches!(
                    self.peek(),
                    None | Some(b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    self.i += 1;
                }
                if self.i == start {
                    return None;
                }
            }
        }
        Some(&self.b[start..self.i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::shared::test_support::arb_json_with;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn by_serde(body: &[u8]) -> Option<Vec<Vec<u8>>> {
        #[derive(serde::Deserialize)]
        struct Msgs<'a> {
            #[serde(borrow)]
            messages: Vec<&'a serde_json::value::RawValue>,
        }
        serde_json::from_slice::<Msgs>(body).ok().map(|m| {
            m.messages
                .iter()
                .map(|r| r.get().as_bytes().to_vec())
                .collect()
        })
    }

    fn by_scan(body: &[u8]) -> Option<Vec<Vec<u8>>> {
        messages(body).map(|v| v.into_iter().map(<[u8]>::to_vec).collect())
    }

    #[test]
    fn cuts_as_serde_does() {
        let bodies = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#.to_string(),
            r#" { "messages" : [ {"role":"system","content":"a \"quoted\" ] } [ text\\"} , {"role":"user","content":[{"type":"text","text":"x"}]} ] , "tools":[{"a":[1,2,{"b":null}]}], "n": -1.5e3, "t": true } "#.to_string(),
            r#"{"messages":[],"messages_x":{"messages":[1]}}"#.to_string(),
            r#"{"stream":false,"messages":[1, "two", null, [3], {"k":"v\u005d"}],"x":"}"}"#.to_string(),
            json!({"messages": [{"role": "user", "content": "é ✓ 😀 \n\t"}]}).to_string(),
            serde_json::to_string_pretty(&json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{\"x\":[1]}"}}]}]})).unwrap(),
        ];
        for b in &bodies {
            assert_eq!(by_scan(b.as_bytes()), by_serde(b.as_bytes()), "{b}");
            assert!(by_scan(b.as_bytes()).is_some(), "{b}");
        }
    }

    #[test]
    fn leaves_to_serde_what_it_cannot_read_surely() {
        for b in [
            r#"{"m\u0065ssages":[1]}"#,           // an escaped key
            r#"{"messages":[1],"messages":[2]}"#, // a repeated key
            r#"{"model":"m"}"#,                   // no messages
            r#"{"messages":{"a":1}}"#,            // not an array
            r#"{"messages":[1]} x"#,              // trailing bytes
            r#"["messages"]"#,                    // not an object
            r#"{}"#,
            r#"{"messages":[1,]}"#,
            r#"{"messages":["unterminated]}"#,
        ] {
            assert_eq!(messages(b.as_bytes()), None, "{b}");
        }
    }

    /// Any JSON, with strings made of the characters a scan must not stop at.
    fn arb_json() -> impl Strategy<Value = Value> {
        let tricky = prop::sample::select(vec!["\"", "\\", "]", "}", "[{", "\\\"]", "\u{1F600}"])
            .prop_map(|s| json!(s));
        arb_json_with(tricky.boxed(), "[a-z\"\\\\\\]]{0,6}")
    }

    proptest! {
        #[test]
        fn agrees_with_serde_on_any_body(
            msgs in prop::collection::vec(arb_json(), 0..6),
            other in arb_json(),
            pretty in any::<bool>(),
            first in any::<bool>(),
        ) {
            let mut body = serde_json::Map::new();
            if first {
                body.insert("messages".into(), Value::Array(msgs.clone()));
                body.insert("other".into(), other);
            } else {
                body.insert("other".into(), other);
                body.insert("messages".into(), Value::Array(msgs));
            }
            let text = if pretty {
                serde_json::to_string_pretty(&body).unwrap()
            } else {
                serde_json::to_string(&body).unwrap()
            };
            prop_assert_eq!(by_scan(text.as_bytes()), by_serde(text.as_bytes()));
        }
    }
}
