//! Every table of the configuration files and its keys, read from the parser's own schema (the
//! raw sections' serde fields), so that what other layers check against (the command line's
//! options, `mt6d peer`'s settings) is the parser's list and never a copy of it that could fall
//! behind.

use serde::de::{self, Deserialize, Visitor};

/// The table names (as written in a file: `gateway`, `peer`, `relay.link`, ...) and each one's
/// keys, in the order the schema declares them.
pub fn tables() -> Vec<(&'static str, &'static [&'static str])> {
    vec![
        ("gateway", keys::<super::raw::RawGateway>()),
        ("peer", keys::<super::raw::RawPeer>()),
        ("tcp", keys::<super::tcp::RawTcp>()),
        ("server", keys::<super::server::RawServer>()),
        ("relay", keys::<super::relay::RawRelay>()),
        ("relay.link", keys::<super::relay::RawLink>()),
        ("relay.e2e", keys::<super::relay::RawE2e>()),
    ]
}

/// The keys of `table` (a name of [`tables`]); None for a table that does not exist.
pub fn keys_of(table: &str) -> Option<&'static [&'static str]> {
    tables()
        .into_iter()
        .find_map(|(name, keys)| (name == table).then_some(keys))
}

/// The field names serde's derive gives `T`'s `deserialize_struct` (after renames): the keys
/// the parser accepts, since every section denies unknown fields.
fn keys<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut names = FieldNames(None);
    // The deserializer refuses every value: the call only records the fields asked for.
    let _ = T::deserialize(&mut names);
    names.0.unwrap_or(&[])
}

/// A deserializer that answers nothing and remembers the fields of the struct asked for.
struct FieldNames(Option<&'static [&'static str]>);

impl<'de> de::Deserializer<'de> for &mut FieldNames {
    type Error = de::value::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = Some(fields);
        Err(de::Error::custom("only the field names are read"))
    }

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list is the parser's: a key it lists parses (here, every `[gateway]` key written
    /// with a value of the wrong type is refused for its type, never as unknown), and a key it
    /// does not list is refused as unknown.
    #[test]
    fn the_listed_keys_are_the_ones_the_parser_accepts() {
        let gateway = keys_of("gateway").expect("gateway table");
        assert!(gateway.len() >= 20, "{gateway:?}");
        for key in [
            "rotation_secs",
            "jitter",
            "mode",
            "aead",
            "derivation",
            "port",
        ] {
            for table in ["gateway", "peer", "server"] {
                assert!(keys_of(table).expect(table).contains(&key), "{table} {key}");
            }
        }
        assert!(keys_of("relay").expect("relay").contains(&"link"));
        assert!(keys_of("relay.e2e")
            .expect("e2e")
            .contains(&"rotation_secs"));
        assert!(keys_of("nowhere").is_none());
        let base = "[gateway]\ninternal_interface = \"eth1\"\nexternal_interface = \"eth0\"\n";
        let parse = |extra: &str| {
            super::super::Config::parse(std::path::Path::new("t.toml"), &format!("{base}{extra}\n"))
        };
        for key in gateway.iter().filter(|k| !base.contains(**k)) {
            if let Err(e) = parse(&format!("{key} = [[]]")) {
                assert!(!e.to_string().contains("unknown field"), "{key}: {e}");
            }
        }
        let e = parse("rotation_seconds = 1")
            .expect_err("unknown")
            .to_string();
        assert!(e.contains("unknown field"), "{e}");
    }
}
