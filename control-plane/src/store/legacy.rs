//! The layout of earlier releases: the whole shared state in one
//! `state.json` (the directory) or one `PREFIX/state` value (etcd), history
//! texts by content address. Read to convert it to parts (`parts.rs`) at
//! the first start; written only by tests and benchmarks (the fixture of a
//! state written by an earlier govd, and what each write cost then).

use super::model::{Persisted, Source, SourceRef, content_address};
use crate::error::Error;

/// Version of the `state.json` layout.
pub(super) const FORMAT: u32 = 1;

/// The legacy form of `state` (JSON, history texts by content address),
/// as an earlier govd wrote it, agents included: what it rewrote on every
/// write of the shared state.
pub fn encode(state: &Persisted) -> Result<Vec<u8>, Error> {
    let mut state = address_texts(state);
    state.format = FORMAT;
    serde_json::to_vec_pretty(&state).map_err(Error::Encode)
}

/// The inverse of [`encode`]; `path` names where it was read, for errors.
pub fn decode(bytes: &[u8], path: &str) -> Result<Persisted, Error> {
    let state: Persisted = serde_json::from_slice(bytes).map_err(|source| Error::CorruptState {
        path: path.to_owned(),
        source,
    })?;
    if state.format != FORMAT {
        return Err(Error::StateFormat {
            path: path.to_owned(),
            found: state.format,
        });
    }
    resolve_texts(state).map_err(|address| Error::MissingText {
        path: path.to_owned(),
        address,
    })
}

/// `state` with each history source's text moved into `texts` under its
/// content address.
fn address_texts(state: &Persisted) -> Persisted {
    let mut out = Persisted {
        history: Vec::with_capacity(state.history.len()),
        ..state.clone()
    };
    for entry in &state.history {
        let mut entry = entry.clone();
        for source in std::mem::take(&mut entry.sources) {
            let address = content_address(&source.text);
            out.texts.entry(address.clone()).or_insert(source.text);
            entry.source_refs.push(SourceRef {
                name: source.name,
                text: address,
            });
        }
        out.history.push(entry);
    }
    out
}

/// The inverse of [`address_texts`]; a reference to a text the file lacks
/// is the error (its address).
fn resolve_texts(mut state: Persisted) -> Result<Persisted, String> {
    let texts = std::mem::take(&mut state.texts);
    for entry in &mut state.history {
        for r in std::mem::take(&mut entry.source_refs) {
            let text = texts.get(&r.text).ok_or_else(|| r.text.clone())?;
            entry.sources.push(Source {
                name: r.name,
                text: text.clone(),
            });
        }
    }
    Ok(state)
}
