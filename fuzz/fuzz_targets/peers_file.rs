//! The server role's peers file: arbitrary bytes must give entries or an error naming a line
//! within the input, never a panic; whatever parses parses the same again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mt6d_proto::peers_file::{parse_bytes, PeersFileError};

fuzz_target!(|data: &[u8]| {
    let lines = 1 + data.iter().filter(|&&b| b == b'\n').count();
    match parse_bytes(data) {
        Ok(entries) => {
            for e in &entries {
                assert!(e.line >= 1 && e.line <= lines);
            }
            assert_eq!(
                parse_bytes(data).map(|again| again.len()),
                Ok(entries.len())
            );
        }
        Err(
            PeersFileError::NotUtf8 { line }
            | PeersFileError::FieldCount { line, .. }
            | PeersFileError::BadField { line, .. },
        ) => assert!(line >= 1 && line <= lines),
        Err(PeersFileError::Duplicate {
            line, first_line, ..
        }) => assert!(first_line < line && line <= lines),
        Err(e) => panic!("unexpected error {e:?}"),
    }
});
