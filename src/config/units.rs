//! The units of the file: human durations (`250ms`, `72h`) and byte sizes (`64KiB`), read
//! and printed back as the file wrote them.

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

/// Parses `250ms`, `5s`, `10m`, `72h`, `7d` (and combinations such as `1h 30m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| format!("invalid duration {text:?}: {e}"))
}

/// Parses `64KiB`, `1GiB`, `500kB` or a plain number of bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    t.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("invalid size {text:?}: {e}"))
}

/// Durations in and out of the file. Out, a duration prints as the file wrote it (`72h`
/// stays `72h`, where a canonical form would say `3days`); a default prints as the configuration
/// table writes it; anything else in the largest unit that keeps it whole.
pub mod duration {
    use super::*;
    use std::cell::RefCell;

    /// How the defaults are written in docs/configuration.md and `config/`.
    const DEFAULT_TEXTS: [&str; 8] = ["5s", "30s", "10s", "25s", "60s", "5m", "72h", "7d"];

    thread_local! {
        /// The written forms in force while one config serializes on this thread. serde
        /// hands a `with` function only the value, so this is how the texts reach it.
        static IN_FORCE: RefCell<BTreeMap<Duration, String>> = const { RefCell::new(BTreeMap::new()) };
    }

    /// Each duration value of a file with the text it was first written as.
    #[derive(Debug, Clone, Default)]
    pub struct Written(BTreeMap<Duration, String>);

    impl Written {
        /// Collects every string of the parsed file that reads as a duration.
        pub fn from_tree(tree: &serde_json::Value) -> Self {
            let mut texts = BTreeMap::new();
            for text in DEFAULT_TEXTS {
                if let Ok(d) = parse_duration(text) {
                    texts.insert(d, text.to_owned());
                }
            }
            let mut written = BTreeMap::new();
            collect(tree, &mut written);
            // What the file wrote wins over how the docs write a default of equal value.
            texts.extend(written);
            Self(texts)
        }

        /// Runs `render` with these texts in force for [`serialize`].
        pub fn while_serializing<T>(&self, render: impl FnOnce() -> T) -> T {
            let texts = if self.0.is_empty() {
                Self::from_tree(&serde_json::Value::Null).0
            } else {
                self.0.clone()
            };
            let previous = IN_FORCE.with(|m| std::mem::replace(&mut *m.borrow_mut(), texts));
            let out = render();
            IN_FORCE.with(|m| *m.borrow_mut() = previous);
            out
        }
    }

    fn collect(tree: &serde_json::Value, into: &mut BTreeMap<Duration, String>) {
        match tree {
            serde_json::Value::String(text) => {
                if let Ok(d) = parse_duration(text) {
                    into.entry(d).or_insert_with(|| text.trim().to_owned());
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| collect(v, into)),
            serde_json::Value::Object(map) => map.values().for_each(|v| collect(v, into)),
            _ => {}
        }
    }

    /// The text of `d`: as written, else in the largest unit that keeps it whole.
    pub fn text(d: Duration) -> String {
        if let Some(t) = IN_FORCE.with(|m| m.borrow().get(&d).cloned()) {
            return t;
        }
        if !d.subsec_nanos().is_multiple_of(1_000_000) {
            return humantime::format_duration(d).to_string();
        }
        let ms = d.as_millis();
        for (unit, per) in [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1000),
        ] {
            if ms > 0 && ms.is_multiple_of(per) {
                return format!("{}{unit}", ms / per);
            }
        }
        format!("{ms}ms")
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s).map_err(de::Error::custom)
    }
    pub fn serialize<S: serde::Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&text(*v))
    }
}

/// Optional durations, for keys that are unset by default.
pub mod opt_duration {
    use super::*;
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        s.map(|s| parse_duration(&s).map_err(de::Error::custom))
            .transpose()
    }
    pub fn serialize<S: serde::Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_str(&duration::text(*v)),
            None => s.serialize_none(),
        }
    }
}

/// Counts where zero is invalid (`NonZeroU32`, `NonZeroUsize`, …): read as a number and
/// refused as "must be positive" when zero, so the value's type carries the rule. Written
/// out as the number (serde's own form of a `NonZero*`).
pub mod positive {
    use super::*;

    pub fn deserialize<'de, D, N>(d: D) -> Result<N, D::Error>
    where
        D: Deserializer<'de>,
        N: TryFrom<NonZeroU64>,
    {
        nonzero(u64::deserialize(d)?)
    }

    /// `n` as `N`, or the error a reader of the file gets.
    pub(super) fn nonzero<N: TryFrom<NonZeroU64>, E: de::Error>(n: u64) -> Result<N, E> {
        let n = NonZeroU64::new(n).ok_or_else(|| E::custom("must be positive"))?;
        N::try_from(n).map_err(|_| E::custom(format!("{n} is too large")))
    }
}

/// Byte sizes in and out of the file: a number of bytes or a size with its unit.
pub mod size {
    use super::*;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(u64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(n),
            Raw::Text(s) => parse_size(&s).map_err(de::Error::custom),
        }
    }
    /// Out, a size prints in the largest unit that keeps it whole, binary (`64KiB`, `1GiB`)
    /// before decimal (`5MB`), as sizes are written in files; otherwise as a number of bytes.
    pub fn serialize<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        match unit_text(*v) {
            Some(text) => s.serialize_str(&text),
            None => s.serialize_u64(*v),
        }
    }

    /// `v` in the largest unit that divides it, if one does.
    fn unit_text(v: u64) -> Option<String> {
        const UNITS: [(u64, &str); 8] = [
            (1 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
            (1_000_000_000_000, "TB"),
            (1_000_000_000, "GB"),
            (1_000_000, "MB"),
            (1_000, "kB"),
        ];
        if v == 0 {
            return None;
        }
        UNITS
            .iter()
            .find(|(unit, _)| v.is_multiple_of(*unit))
            .map(|(unit, name)| format!("{}{name}", v / unit))
    }

    /// Sizes where zero is invalid, as [`positive`] reads counts.
    pub mod positive {
        use super::*;

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<NonZeroU64, D::Error> {
            super::super::positive::nonzero(super::deserialize(d)?)
        }
        pub fn serialize<S: serde::Serializer>(v: &NonZeroU64, s: S) -> Result<S::Ok, S::Error> {
            super::serialize(&v.get(), s)
        }
    }

    /// How `v` prints: [`unit_text`], else the number of bytes.
    #[cfg(test)]
    pub fn text(v: u64) -> String {
        unit_text(v).unwrap_or_else(|| v.to_string())
    }
}
