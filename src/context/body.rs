//! The body of a rewritten request: the client's fields in their order, with the rewritten messages in place of
//! theirs, borrowed where unchanged, and serialised without copying them.

use crate::message::Source;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};
use std::borrow::Cow;

/// A rewritten request body, ready to be extended (recall tools, note) and serialised.
#[derive(Debug, Clone, PartialEq)]
pub struct RewrittenBody<'a> {
    /// The client's fields but its messages, in the client's order (the conversation keeps its place as `null`).
    pub fields: Map<String, Value>,
    /// The field holding the conversation: `messages`, or `input` (Responses).
    pub key: &'static str,
    /// The messages to send (neutral).
    pub messages: Vec<Cow<'a, Value>>,
    /// Where each message comes from (aligned with `messages`): a dialect renders the client's own messages back
    /// from their originals.
    pub sources: Vec<Source>,
    /// Where a note about the rewrite goes in `messages` (see `context::Rewrite::note_at`); `None`: after the
    /// leading system messages.
    pub note_at: Option<usize>,
    /// With strict role order: the message the note is appended to instead (see `context::Rewrite::note_in`).
    pub note_in: Option<usize>,
    /// Strict role order: the note is never a message of its own (left out when `note_in` is `None`).
    pub strict_roles: bool,
}

impl<'a> RewrittenBody<'a> {
    /// `client`'s fields (copied, but its messages) with `messages` (from `sources`) as its messages.
    pub fn new(
        client: &Map<String, Value>,
        messages: Vec<Cow<'a, Value>>,
        sources: Vec<Source>,
    ) -> Self {
        Self::new_at("messages", client, messages, sources)
    }

    /// [`RewrittenBody::new`] for a conversation kept under `key` (`input` for the Responses API).
    pub fn new_at(
        key: &'static str,
        client: &Map<String, Value>,
        messages: Vec<Cow<'a, Value>>,
        sources: Vec<Source>,
    ) -> Self {
        let mut fields = Map::with_capacity(client.len() + 1);
        for (k, v) in client {
            let v = if k == key { Value::Null } else { v.clone() };
            fields.insert(k.clone(), v);
        }
        fields.entry(key).or_insert(Value::Null);
        Self {
            fields,
            key,
            messages,
            sources,
            note_at: None,
            note_in: None,
            strict_roles: false,
        }
    }

    /// The body as JSON bytes (as `serde_json::to_vec` writes it), and the offset of the `]` closing its
    /// messages: later messages can be spliced in there without parsing the body again.
    pub fn to_vec(&self) -> serde_json::Result<(Vec<u8>, usize)> {
        self.to_vec_with(&self.messages)
    }

    /// The body as JSON bytes with `messages` (any serialisable list: a dialect's rendering of them) in place of
    /// its messages, and the offset of the `]` closing them.
    pub fn to_vec_with<M: Serialize>(&self, messages: &M) -> serde_json::Result<(Vec<u8>, usize)> {
        let mut out = Vec::with_capacity(1024);
        let mut close = 0;
        out.push(b'{');
        for (i, (k, v)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            serde_json::to_writer(&mut out, k)?;
            out.push(b':');
            if k == self.key {
                serde_json::to_writer(&mut out, messages)?;
                close = out.len() - 1;
            } else {
                serde_json::to_writer(&mut out, v)?;
            }
        }
        out.push(b'}');
        Ok((out, close))
    }

    /// The body as an owned JSON object.
    pub fn to_map(&self) -> Map<String, Value> {
        let mut out = self.fields.clone();
        out.insert(
            self.key.into(),
            Value::Array(self.messages.iter().map(|m| m.as_ref().clone()).collect()),
        );
        out
    }
}

/// `body` (JSON written by [`RewrittenBody::to_vec`]) with `more` appended to its messages, whose array closes
/// at `close`. `None` when `close` is not where a non-empty messages array ends.
pub fn splice_messages(body: &[u8], close: usize, more: &[Value]) -> Option<Vec<u8>> {
    if body.get(close) != Some(&b']') || close == 0 || body.get(close - 1) == Some(&b'[') {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() + 256 * more.len());
    out.extend_from_slice(&body[..close]);
    for m in more {
        out.push(b',');
        serde_json::to_writer(&mut out, m).ok()?;
    }
    out.extend_from_slice(&body[close..]);
    Some(out)
}

impl Serialize for RewrittenBody<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.fields.len()))?;
        for (k, v) in &self.fields {
            if k == self.key {
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
        let body = RewrittenBody::new(
            client.as_object().unwrap(),
            vec![Cow::Borrowed(&new)],
            vec![Source::Client(0)],
        );
        let (bytes, close) = body.to_vec().unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert_eq!(
            text,
            r#"{"model":"m","messages":[{"role":"user","content":"short"}],"stream":true,"tools":[],"x_vendor":{"a":1}}"#
        );
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            text,
            "as serde writes it"
        );
        assert_eq!(
            serde_json::to_string(&body.to_map()).unwrap(),
            text,
            "the owned form serialises the same"
        );
        // later messages spliced in where the array closes, exactly as if they had been there
        let more = [
            json!({"role": "assistant", "content": "a \"]\" b"}),
            json!({"role": "user", "content": "c"}),
        ];
        let spliced = splice_messages(&bytes, close, &more).unwrap();
        let mut expected = body.clone();
        expected.messages.extend(more.iter().map(Cow::Borrowed));
        assert_eq!(spliced, expected.to_vec().unwrap().0);
        assert_eq!(
            splice_messages(&bytes, close - 1, &more),
            None,
            "a wrong offset is refused"
        );
        assert_eq!(
            splice_messages(br#"{"messages":[]}"#, 13, &more),
            None,
            "so is an empty array"
        );
    }
}
