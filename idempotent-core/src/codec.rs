//! Results and fingerprints as bytes: JSON with serde, so `redis-cli` shows them.

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha1::{Digest, Sha1};

/// A result encoded for the store: JSON bytes, or `None` when it cannot be replayed.
pub(crate) enum Encoded {
    Replayable(Vec<u8>),
    /// Larger than the limit; the reason goes to the log.
    NotReplayable(String),
}

/// Encodes a result for the store, checking that it replays as itself: its JSON form must read
/// back as a value whose JSON form is the same (map order aside), with no `Some` of a value
/// written as `null` and no non-finite float, which JSON cannot tell apart (see [`exact`]).
/// `Err` says why it cannot be stored; a result over `max_bytes` is stored as not replayable.
pub(crate) fn encode<T: Serialize + DeserializeOwned>(value: &T, max_bytes: usize) -> Result<Encoded, String> {
    exact(value)?;
    let bytes = serde_json::to_vec(value).map_err(|e| format!("it does not serialize as JSON: {e}"))?;
    if bytes.len() > max_bytes {
        return Ok(Encoded::NotReplayable(format!(
            "the result is {} bytes, over the {max_bytes}-byte limit",
            bytes.len()
        )));
    }
    let back: T = serde_json::from_slice(&bytes)
        .map_err(|e| format!("its JSON form ({}) does not read back as the type: {e}", shorten(&bytes)))?;
    let again = serde_json::to_vec(&back).map_err(|e| format!("the value read back does not serialize: {e}"))?;
    if again != bytes {
        // Maps may come back in another order: compare the JSON values, whose maps are ordered.
        let as_value = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).ok();
        if as_value(&again).is_none() || as_value(&again) != as_value(&bytes) {
            return Err(format!("it is written as {} but reads back as {}", shorten(&bytes), shorten(&again)));
        }
    }
    Ok(Encoded::Replayable(bytes))
}

/// At most 200 bytes of JSON, for an error message.
fn shorten(json: &[u8]) -> String {
    let text = String::from_utf8_lossy(json);
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.into_owned(),
    }
}

/// Checks what JSON cannot carry exactly: `Some(x)` where `x` is written as `null` (`Some(())`,
/// `Some(None)`, `Some(Value::Null)`: each reads back as `None`) and non-finite floats (NaN and
/// the infinities are written `null`).
pub(crate) fn exact<T: Serialize + ?Sized>(value: &T) -> Result<(), String> {
    value.serialize(exact::Exact).map_err(|e| e.0)
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    // Checking the UTF-8 once, up front, spares serde_json checking it string by string; bytes
    // that are not UTF-8 go the slow way, for serde_json's own error.
    let decoded = match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    };
    decoded.map_err(|e| {
        format!(
            "the stored result does not decode as {}: {e} (did the result type change?)",
            std::any::type_name::<T>()
        )
    })
}

/// The largest payload a fingerprint is computed over, as JSON: 1 MiB. A larger one is refused
/// ([`Error::InvalidCall`](crate::Error::InvalidCall)) before its canonical form is built.
pub const MAX_FINGERPRINT_BYTES: usize = 1 << 20;

/// Counts what is written and fails past a limit.
struct Bounded {
    written: usize,
    limit: usize,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written += buf.len();
        if self.written > self.limit {
            return Err(std::io::Error::other("over the limit"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Why a fingerprint could not be computed.
#[derive(Debug, Clone)]
pub(crate) enum FingerprintError {
    /// The payload does not serialize.
    Codec(String),
    /// The payload is larger than [`MAX_FINGERPRINT_BYTES`].
    TooLarge,
}

/// The fingerprint of a payload: 128 bits of SHA-1 over its canonical JSON (object keys sorted,
/// so two equal maps give one fingerprint whatever their iteration order), as 32 hex digits. Its
/// size is checked first, writing nothing: a payload over [`MAX_FINGERPRINT_BYTES`] is refused.
pub(crate) fn fingerprint<T: Serialize + ?Sized>(payload: &T) -> Result<String, FingerprintError> {
    let mut bounded = Bounded { written: 0, limit: MAX_FINGERPRINT_BYTES };
    if let Err(e) = serde_json::to_writer(&mut bounded, payload) {
        return Err(if bounded.written > bounded.limit {
            FingerprintError::TooLarge
        } else {
            FingerprintError::Codec(format!("the fingerprint payload does not serialize: {e}"))
        });
    }
    fingerprint_json(payload).map_err(FingerprintError::Codec)
}

fn fingerprint_json<T: Serialize + ?Sized>(payload: &T) -> Result<String, String> {
    let canonical = serde_json::to_value(payload)
        .and_then(|v| serde_json::to_vec(&v))
        .map_err(|e| format!("the fingerprint payload does not serialize: {e}"))?;
    Ok(hex128(Sha1::new_with_prefix(b"json\0").chain_update(&canonical)))
}

/// The fingerprint of raw byte parts (an HTTP method, target and body, say), hashed as they are:
/// each part's length, then its bytes, so that no two different lists of parts collide by
/// concatenation. A `bytes` tag keeps it apart from the serde form.
pub(crate) fn fingerprint_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut hash = Sha1::new_with_prefix(b"bytes\0");
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hex128(hash)
}

/// The first 128 bits of a digest, as 32 hex digits.
fn hex128(hash: Sha1) -> String {
    hash.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

mod exact {
    //! A serializer that writes nothing and fails on what JSON cannot carry exactly.

    use serde::ser::{self, Impossible, Serialize};

    #[derive(Debug)]
    pub(super) struct Inexact(pub(super) String);

    impl std::fmt::Display for Inexact {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for Inexact {}

    impl ser::Error for Inexact {
        fn custom<M: std::fmt::Display>(msg: M) -> Self {
            Inexact(msg.to_string())
        }
    }

    fn float(v: f64) -> Result<(), Inexact> {
        if v.is_finite() {
            Ok(())
        } else {
            Err(Inexact(format!("it holds the float {v}, which JSON writes as null")))
        }
    }

    pub(super) struct Exact;

    macro_rules! fine {
        ($($method:ident: $ty:ty),*) => {
            $(fn $method(self, _: $ty) -> Result<(), Inexact> { Ok(()) })*
        };
    }

    impl ser::Serializer for Exact {
        type Ok = ();
        type Error = Inexact;
        type SerializeSeq = Self;
        type SerializeTuple = Self;
        type SerializeTupleStruct = Self;
        type SerializeTupleVariant = Self;
        type SerializeMap = Self;
        type SerializeStruct = Self;
        type SerializeStructVariant = Self;

        fine!(serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
              serialize_i128: i128, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32, serialize_u64: u64,
              serialize_u128: u128, serialize_char: char, serialize_str: &str, serialize_bytes: &[u8],
              serialize_unit_struct: &'static str);

        fn serialize_f32(self, v: f32) -> Result<(), Inexact> {
            float(f64::from(v))
        }
        fn serialize_f64(self, v: f64) -> Result<(), Inexact> {
            float(v)
        }
        fn serialize_none(self) -> Result<(), Inexact> {
            Ok(())
        }
        fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Inexact> {
            if value.serialize(IsNull).unwrap_or(false) {
                return Err(Inexact(
                    "it holds `Some` of a value written as null (such as `Some(())` or `Some(None)`), which reads \
                     back as `None`"
                        .into(),
                ));
            }
            value.serialize(self)
        }
        fn serialize_unit(self) -> Result<(), Inexact> {
            Ok(())
        }
        fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), Inexact> {
            Ok(())
        }
        fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), Inexact> {
            value.serialize(self)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            value: &T,
        ) -> Result<(), Inexact> {
            value.serialize(self)
        }
        fn serialize_seq(self, _: Option<usize>) -> Result<Self, Inexact> {
            Ok(self)
        }
        fn serialize_tuple(self, _: usize) -> Result<Self, Inexact> {
            Ok(self)
        }
        fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, Inexact> {
            Ok(self)
        }
        fn serialize_tuple_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Self, Inexact> {
            Ok(self)
        }
        fn serialize_map(self, _: Option<usize>) -> Result<Self, Inexact> {
            Ok(self)
        }
        fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Inexact> {
            Ok(self)
        }
        fn serialize_struct_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Self, Inexact> {
            Ok(self)
        }
    }

    macro_rules! elements {
        ($($trait:ident :: $method:ident),*) => {
            $(impl ser::$trait for Exact {
                type Ok = ();
                type Error = Inexact;
                fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Inexact> {
                    value.serialize(Exact)
                }
                fn end(self) -> Result<(), Inexact> {
                    Ok(())
                }
            })*
        };
    }
    elements!(
        SerializeSeq::serialize_element,
        SerializeTuple::serialize_element,
        SerializeTupleStruct::serialize_field,
        SerializeTupleVariant::serialize_field
    );

    impl ser::SerializeMap for Exact {
        type Ok = ();
        type Error = Inexact;
        fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Inexact> {
            key.serialize(Exact)
        }
        fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Inexact> {
            value.serialize(Exact)
        }
        fn end(self) -> Result<(), Inexact> {
            Ok(())
        }
    }

    macro_rules! fields {
        ($($trait:ident),*) => {
            $(impl ser::$trait for Exact {
                type Ok = ();
                type Error = Inexact;
                fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, value: &T) -> Result<(), Inexact> {
                    value.serialize(Exact)
                }
                fn end(self) -> Result<(), Inexact> {
                    Ok(())
                }
            })*
        };
    }
    fields!(SerializeStruct, SerializeStructVariant);

    fn compound<T>() -> Result<T, Inexact> {
        Err(Inexact("a compound value".into()))
    }

    /// Whether a value is written as JSON `null`: `Ok(true)` for unit, `None`, a unit struct, or
    /// `Some`/a newtype of one; anything else is `Ok(false)` or an error (compound values).
    struct IsNull;

    macro_rules! not_null {
        ($($method:ident: $ty:ty),*) => {
            $(fn $method(self, _: $ty) -> Result<bool, Inexact> { Ok(false) })*
        };
    }

    impl ser::Serializer for IsNull {
        type Ok = bool;
        type Error = Inexact;
        type SerializeSeq = Impossible<bool, Inexact>;
        type SerializeTuple = Impossible<bool, Inexact>;
        type SerializeTupleStruct = Impossible<bool, Inexact>;
        type SerializeTupleVariant = Impossible<bool, Inexact>;
        type SerializeMap = Impossible<bool, Inexact>;
        type SerializeStruct = Impossible<bool, Inexact>;
        type SerializeStructVariant = Impossible<bool, Inexact>;

        // A non-finite float is written as null too, but `Exact` names it for what it is.
        not_null!(serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
                  serialize_i128: i128, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32, serialize_u64: u64,
                  serialize_u128: u128, serialize_f32: f32, serialize_f64: f64, serialize_char: char,
                  serialize_str: &str, serialize_bytes: &[u8]);
        fn serialize_none(self) -> Result<bool, Inexact> {
            Ok(true)
        }
        fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<bool, Inexact> {
            value.serialize(self)
        }
        fn serialize_unit(self) -> Result<bool, Inexact> {
            Ok(true)
        }
        fn serialize_unit_struct(self, _: &'static str) -> Result<bool, Inexact> {
            Ok(true)
        }
        fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<bool, Inexact> {
            Ok(false)
        }
        fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<bool, Inexact> {
            value.serialize(self)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: &T,
        ) -> Result<bool, Inexact> {
            Ok(false)
        }
        // Compound values are never written as null: an error ends the probe early, read as false.
        fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Inexact> {
            compound()
        }
        fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Inexact> {
            compound()
        }
        fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, Inexact> {
            compound()
        }
        fn serialize_tuple_variant(
            self,
            _: &str,
            _: u32,
            _: &str,
            _: usize,
        ) -> Result<Self::SerializeTupleVariant, Inexact> {
            compound()
        }
        fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Inexact> {
            compound()
        }
        fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Inexact> {
            compound()
        }
        fn serialize_struct_variant(
            self,
            _: &str,
            _: u32,
            _: &str,
            _: usize,
        ) -> Result<Self::SerializeStructVariant, Inexact> {
            compound()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn falsy_values_round_trip() {
        fn round<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(v: T) {
            let Ok(Encoded::Replayable(bytes)) = encode(&v, 1 << 20) else { panic!("not replayable") };
            assert_eq!(decode::<T>(&bytes).unwrap(), v);
        }
        round(());
        round(0u8);
        round(false);
        round(String::new());
        round(None::<u32>);
        round(Vec::<u32>::new());
    }

    #[test]
    fn over_the_limit_is_not_replayable() {
        assert!(matches!(encode(&"x".repeat(100), 50), Ok(Encoded::NotReplayable(_))));
    }

    #[test]
    fn values_json_cannot_carry_are_refused() {
        let refused = |e: Result<Encoded, String>, says: &str| match e {
            Err(why) => assert!(why.contains(says), "{why}"),
            Ok(_) => panic!("accepted; expected {says:?}"),
        };
        refused(encode(&Some(()), 1 << 20), "Some");
        refused(encode(&Some(None::<u8>), 1 << 20), "Some");
        refused(encode(&vec![Some(Some(())), None], 1 << 20), "Some");
        refused(encode(&f64::NAN, 1 << 20), "NaN");
        refused(encode(&Some(f64::INFINITY), 1 << 20), "inf");
        let tuple_keys: HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        refused(encode(&tuple_keys, 1 << 20), "does not serialize");
        // Maps come back in another order, and are still the same value.
        let many: HashMap<String, u32> = (0..64).map(|i| (format!("k{i}"), i)).collect();
        assert!(matches!(encode(&many, 1 << 20), Ok(Encoded::Replayable(_))));
        assert!(matches!(encode(&Some(0.5f64), 1 << 20), Ok(Encoded::Replayable(_))));
        assert!(matches!(encode(&Some(Some(1u8)), 1 << 20), Ok(Encoded::Replayable(_))));
    }

    /// A value that reads back as another one is refused, whether its second form differs
    /// midway or stops short of the first (written as `123`, read back as 12, written `12`): what
    /// any cheaper comparison of the two forms must still refuse.
    #[test]
    fn values_that_read_back_as_others_are_refused() {
        #[derive(Serialize)]
        struct Tenths(u64);
        impl<'de> serde::Deserialize<'de> for Tenths {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                u64::deserialize(d).map(|n| Tenths(n / 10))
            }
        }
        #[derive(Serialize, serde::Deserialize)]
        struct Skipped {
            a: u32,
            #[serde(skip_deserializing)]
            b: u32,
        }
        let refused = |e: Result<Encoded, String>, says: &str| match e {
            Err(why) => assert!(why.contains(says), "{why}"),
            Ok(_) => panic!("accepted; expected {says:?}"),
        };
        refused(encode(&Tenths(123), 1 << 20), "written as 123 but reads back as 12");
        refused(encode(&Skipped { a: 1, b: 5 }, 1 << 20), r#"reads back as {"a":1,"b":0}"#);
        assert!(matches!(encode(&Tenths(0), 1 << 20), Ok(Encoded::Replayable(_))));
        assert!(matches!(encode(&Skipped { a: 1, b: 0 }, 1 << 20), Ok(Encoded::Replayable(_))));
    }

    #[test]
    fn fingerprint_ignores_map_order() {
        let a: HashMap<String, u32> = (0..50).map(|i| (format!("k{i}"), i)).collect();
        let mut b: HashMap<String, u32> = HashMap::new();
        for i in (0..50).rev() {
            b.insert(format!("k{i}"), i);
        }
        let ok = |r: Result<String, FingerprintError>| r.unwrap_or_else(|_| panic!("no fingerprint"));
        assert_eq!(ok(fingerprint(&a)), ok(fingerprint(&b)));
        assert_ne!(ok(fingerprint(&1)), ok(fingerprint(&2)));
        assert!(matches!(fingerprint(&"x".repeat(MAX_FINGERPRINT_BYTES)), Err(FingerprintError::TooLarge)));
    }

    #[test]
    fn byte_parts_do_not_collide_by_concatenation() {
        let a = fingerprint_parts([&b"POST"[..], b"/a", b"bc"]);
        assert_eq!(a, fingerprint_parts([&b"POST"[..], b"/a", b"bc"]));
        assert_ne!(a, fingerprint_parts([&b"POST"[..], b"/ab", b"c"]));
        assert_ne!(a, fingerprint_parts([&b"POST"[..], b"/a", b"bd"]));
    }
}
