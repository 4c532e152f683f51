//! Pushes that do not copy: a message to agents encoded once and shared by
//! every stream it goes to (issue 35).
//!
//! A `ControlMessage` is encoded here, when it is queued, not by tonic per
//! stream: an endpoint set pushed to N agents is one encoding whose bytes
//! (a [`Bytes`], reference counted) every stream shares; a config is its
//! service version's `TargetConfig` encoded once ([`EncodedTargets`]) and,
//! per agent, only the few bytes around it that carry the agent's nonce.
//! The agents' queues hold these (a few words each), not decoded messages.
//!
//! On the wire the bytes are exactly the `ControlMessage` prost would write
//! (protobuf fields are concatenated records: the shared target field and
//! the per-agent nonce field are two records of one `Config`), so agents
//! see no difference. The `Connect` RPC is served with a codec whose
//! outbound type is [`Encoded`] (`server.rs`).

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};
use gov_proto::v1 as pb;
use prost::Message as _;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

/// `ControlMessage.config` and `Config.target`: field 1.
const CONFIG_FIELD: u32 = 1;
/// `Config.nonce`: field 2.
const NONCE_FIELD: u32 = 2;

/// The first byte of a `ControlMessage` whose oneof is `endpoints` (field
/// 3) or `endpoints_delta` (field 4): the field's key, length-delimited.
const ENDPOINTS_KEY: u8 = (3 << 3) | 2;
const ENDPOINTS_DELTA_KEY: u8 = (4 << 3) | 2;

/// How an endpoint set goes to an agent (issue 35).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointsForm {
    /// `Endpoints`: the whole set.
    Full,
    /// `EndpointsDelta`: one change onto the version the agent holds.
    Delta,
}

/// One `ControlMessage` as it goes on the wire: `head`, then `shared` (the
/// same bytes for every agent it is sent to), then `tail`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Encoded {
    head: Bytes,
    shared: Bytes,
    tail: Bytes,
    /// A config's nonce (its push clock starts when it is sent).
    nonce: Option<Box<str>>,
}

impl Encoded {
    /// `msg` encoded (for messages sent to one agent, or shared by cloning
    /// the result: a clone copies no bytes).
    pub fn new(msg: &pb::ControlMessage) -> Self {
        let nonce = match &msg.msg {
            Some(pb::control_message::Msg::Config(c)) => Some(c.nonce.as_str().into()),
            _ => None,
        };
        Encoded {
            shared: Bytes::from(msg.encode_to_vec()),
            nonce,
            ..Encoded::default()
        }
    }

    /// A config push: `target` (the `Config.target` field encoded once, see
    /// [`EncodedTargets`]) and this agent's `nonce`.
    pub fn config(target: &Bytes, nonce: &str) -> Self {
        let mut tail = BytesMut::with_capacity(2 + nonce.len());
        encode_key(NONCE_FIELD, WireType::LengthDelimited, &mut tail);
        encode_varint(nonce.len() as u64, &mut tail);
        tail.put_slice(nonce.as_bytes());
        let config_len = target.len() + tail.len();
        let mut head = BytesMut::with_capacity(1 + encoded_len_varint(config_len as u64));
        encode_key(CONFIG_FIELD, WireType::LengthDelimited, &mut head);
        encode_varint(config_len as u64, &mut head);
        Encoded {
            head: head.freeze(),
            shared: target.clone(),
            tail: tail.freeze(),
            nonce: Some(nonce.into()),
        }
    }

    /// The nonce of a config push.
    pub fn nonce(&self) -> Option<&str> {
        self.nonce.as_deref()
    }

    /// Whether these bytes are an endpoint set, whole or a delta (read from
    /// the message's one field key: a message of [`Encoded::new`] is all
    /// `shared`).
    pub fn endpoints_form(&self) -> Option<EndpointsForm> {
        if !self.head.is_empty() {
            return None;
        }
        match self.shared.first() {
            Some(&ENDPOINTS_KEY) => Some(EndpointsForm::Full),
            Some(&ENDPOINTS_DELTA_KEY) => Some(EndpointsForm::Delta),
            _ => None,
        }
    }

    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.shared.len() + self.tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes shared with every other copy of this push.
    pub fn shared(&self) -> &Bytes {
        &self.shared
    }

    /// The message these bytes encode, as an agent reads it.
    pub fn decode(&self) -> Result<pb::ControlMessage, prost::DecodeError> {
        let mut bytes = Vec::with_capacity(self.len());
        bytes.extend_from_slice(&self.head);
        bytes.extend_from_slice(&self.shared);
        bytes.extend_from_slice(&self.tail);
        pb::ControlMessage::decode(bytes.as_slice())
    }

    /// The message (tests and the in-process fallback); a message that does
    /// not decode (none does: govd encoded it) reads as empty.
    pub fn message(&self) -> pb::ControlMessage {
        self.decode().unwrap_or_default()
    }
}

/// Written by tonic's codec as it is: the bytes are a `ControlMessage`.
impl prost::Message for Encoded {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.head);
        buf.put_slice(&self.shared);
        buf.put_slice(&self.tail);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Never decoded (govd only sends these).
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.len()
    }

    fn clear(&mut self) {
        *self = Encoded::default();
    }
}

/// A stream's encode and decode buffers start at this (tonic's default is
/// 8 KiB each, allocated per stream: 16 KiB of every agent's memory) and
/// grow as a larger message needs.
const STREAM_BUFFER: usize = 1024;
/// tonic's default: a stream yields after this many bytes encoded.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// The codec of agent streams: [`Encoded`] out, `AgentMessage` in, with
/// small buffers.
#[derive(Debug, Default, Clone, Copy)]
pub struct AgentCodec;

impl tonic::codec::Codec for AgentCodec {
    type Encode = Encoded;
    type Decode = pb::AgentMessage;
    type Encoder = tonic_prost::ProstEncoder<Encoded>;
    type Decoder = tonic_prost::ProstDecoder<pb::AgentMessage>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(tonic::codec::BufferSettings::new(
            STREAM_BUFFER,
            YIELD_THRESHOLD,
        ))
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(tonic::codec::BufferSettings::new(
            STREAM_BUFFER,
            YIELD_THRESHOLD,
        ))
    }
}

/// Each config version's `Config.target` field, encoded once: every agent
/// of a service (or of a canary) is sent the same bytes.
#[derive(Debug, Default)]
pub struct EncodedTargets {
    by_version: HashMap<(String, String), Bytes>,
}

/// Versions kept before the cache starts over (a policy has one per
/// service; canaries add a few).
const MAX_TARGETS: usize = 4096;

impl EncodedTargets {
    /// The version and the encoded `target` field of the config agents of
    /// `service` enforce: `trial` (a canary's) when there is one, else the
    /// bundle's, else the empty config of a service the policy does not name.
    pub fn for_service(
        &mut self,
        trial: Option<&pb::TargetConfig>,
        bundle: Option<&pb::Bundle>,
        service: &str,
    ) -> (String, Bytes) {
        let named = bundle.and_then(|b| b.targets.iter().find(|t| t.service == service));
        match trial.or(named) {
            Some(target) => (target.version.clone(), self.get(target)),
            None => {
                let target = gov_proto::compiled::target(service);
                (target.version.clone(), self.get(&target))
            }
        }
    }

    /// The encoded `target` field of `target`'s version.
    pub fn get(&mut self, target: &pb::TargetConfig) -> Bytes {
        let key = (target.service.clone(), target.version.clone());
        if let Some(bytes) = self.by_version.get(&key) {
            return bytes.clone();
        }
        if self.by_version.len() >= MAX_TARGETS {
            self.by_version.clear();
        }
        let mut field = BytesMut::with_capacity(target.encoded_len() + 8);
        prost::encoding::message::encode(CONFIG_FIELD, target, &mut field);
        let field = field.freeze();
        // Keyed with the service too: every service the policy does not
        // name has the version "" (an empty config naming its service).
        self.by_version.insert(key, field.clone());
        field
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(version: &str) -> pb::TargetConfig {
        pb::TargetConfig {
            service: "order".into(),
            version: version.into(),
            consumer_header: "x-gov-consumer".into(),
            ..Default::default()
        }
    }

    /// The pre-encoded config is byte for byte what prost writes for the
    /// same message, so agents of any version read it.
    #[test]
    fn a_config_encoded_once_is_the_message_prost_would_write() {
        let mut targets = EncodedTargets::default();
        let t = target("v1");
        let shared = targets.get(&t);
        let encoded = Encoded::config(&shared, "00ab-7");
        let msg = pb::ControlMessage {
            msg: Some(pb::control_message::Msg::Config(pb::Config {
                target: Some(t),
                nonce: "00ab-7".into(),
            })),
        };
        let mut wire = Vec::new();
        prost::Message::encode(&encoded, &mut wire).expect("encode");
        assert_eq!(wire, msg.encode_to_vec());
        assert_eq!(encoded.message(), msg);
        assert_eq!(encoded.nonce(), Some("00ab-7"));
    }

    /// Two agents' pushes of one version share the target's bytes (one
    /// allocation) and differ only in their nonces.
    #[test]
    fn two_agents_share_one_encoding_of_a_version() {
        let mut targets = EncodedTargets::default();
        let a = Encoded::config(&targets.get(&target("v1")), "n-1");
        let b = Encoded::config(&targets.get(&target("v1")), "n-2");
        assert_eq!(a.shared().as_ptr(), b.shared().as_ptr());
        assert_ne!(a.message(), b.message());
        let c = Encoded::config(&targets.get(&target("v2")), "n-3");
        assert_ne!(a.shared().as_ptr(), c.shared().as_ptr());
    }

    #[test]
    fn a_shared_message_is_one_encoding_for_every_stream() {
        let msg = pb::ControlMessage {
            msg: Some(pb::control_message::Msg::Endpoints(pb::Endpoints {
                service: "order".into(),
                version: 3,
                ..Default::default()
            })),
        };
        let one = Encoded::new(&msg);
        let two = one.clone();
        assert_eq!(one.shared().as_ptr(), two.shared().as_ptr());
        assert_eq!(two.message(), msg);
        assert_eq!(one.nonce(), None);
        assert_eq!(one.endpoints_form(), Some(EndpointsForm::Full));
        let delta = Encoded::new(&pb::ControlMessage {
            msg: Some(pb::control_message::Msg::EndpointsDelta(
                pb::EndpointsDelta::default(),
            )),
        });
        assert_eq!(delta.endpoints_form(), Some(EndpointsForm::Delta));
        let config = Encoded::config(&EncodedTargets::default().get(&target("v1")), "n");
        assert_eq!(config.endpoints_form(), None);
        let command = Encoded::new(&pb::ControlMessage {
            msg: Some(pb::control_message::Msg::Command(pb::Command::default())),
        });
        assert_eq!(command.endpoints_form(), None);
    }
}
