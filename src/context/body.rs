//! The body of a rewritten request: the client's fields in their order, with the rewritten messages in place of
//! theirs, borrowed where unchanged, and serialised without copying them.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};
use std::borrow::Cow;

/// A rewritten request body, ready to be extended (recall tools, note) and serialised.
#[derive(Debug, Clone, PartialEq)]
pub struct RewrittenBody<'a> {
    /// The client's fields but its messages, in the client's order (`messages` keeps its place as `null`).
    pub fields: Map<String, Value>,
    /// The messages to send.
    pub messages: Vec<Cow<'a, Value>>,
}

impl<'a> RewrittenBody<'a> {
    /// `client`'s fields (copied, but its messages) with `messages` as its messages.
    pub fn new(client: &Map<String, Value>, messages: Vec<Cow<'a, Value>>) -> Self {
        let mut fields = Map::with_capacity(client.len() + 1);
        for (k, v) in client {
            let v = if k == "messages" {
                Value::Null
            } else {
                v.clone()
            };
            fields.insert(k.clone(), v);
        }
        fields.entry("messages").or_insert(Value::Null);
        Self { fields, messages }
    }

    /// The body as JSON bytes.
    pub fn to_vec(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(self)
    }

    /// The body as an owned JSON object.
    pub fn to_map(&self) -> Map<String, Value> {
        let mut out = self.fields.clone();
        out.insert(
            "messages".into(),
            Value::Array(self.messages.iter().map(|m| m.as_ref().clone()).collect()),
        );
        out
    }
}

impl Serialize for RewrittenBody<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.fields.len()))?;
        for (k, v) in &self.fields {
            if k == "messages" {
                map.serialize_entry(k, &self.messages)?;
            } else {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keeps_the_clients_field_order_and_replaces_only_the_messages() {
        let client = json!({"model": "m", "messages": [{"role": "user", "content": "long"}], "stream": true,
            "tools": [], "x_vendor": {"a": 1}});
        let new = json!({"role": "user", "content": "short"});
        let body = RewrittenBody::new(client.as_object().unwrap(), vec![Cow::Borrowed(&new)]);
        let text = String::from_utf8(body.to_vec().unwrap()).unwrap();
        assert_eq!(
            text,
            r#"{"model":"m","messages":[{"role":"user","content":"short"}],"stream":true,"tools":[],"x_vendor":{"a":1}}"#
        );
        assert_eq!(
            serde_json::to_string(&body.to_map()).unwrap(),
            text,
            "the owned form serialises the same"
        );
    }
}
