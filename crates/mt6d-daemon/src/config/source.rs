//! Where in a configuration file a value came from, for errors a person can open.

use std::fmt;
use std::path::Path;

use toml::Spanned;

use super::ConfigError;

/// Reads a configuration file; the error names it.
pub(super) fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Turns byte offsets into the `file:line:column` a person can open.
pub(super) struct Source<'a> {
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
}

impl Source<'_> {
    /// The text deserialised as `T`; a TOML or schema error (an unknown key, a missing one, a
    /// wrong type) names its place.
    pub(super) fn parse_toml<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConfigError> {
        toml::from_str(self.text).map_err(|e| match e.span() {
            Some(span) => self.err_at(span, e.message()),
            None => ConfigError::File {
                path: self.path.to_path_buf(),
                message: e.message().to_string(),
            },
        })
    }

    pub(super) fn err_at(
        &self,
        span: std::ops::Range<usize>,
        message: impl fmt::Display,
    ) -> ConfigError {
        let start = span.start.min(self.text.len());
        let before = &self.text[..start];
        let line = before.matches('\n').count() + 1;
        let column = start - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        ConfigError::At {
            path: self.path.to_path_buf(),
            line,
            column,
            message: message.to_string(),
        }
    }

    pub(super) fn err<T>(&self, item: &Spanned<T>, message: impl fmt::Display) -> ConfigError {
        self.err_at(item.span(), message)
    }
}
