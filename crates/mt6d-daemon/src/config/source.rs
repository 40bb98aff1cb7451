//! Where in a configuration file a value came from, for errors a person can open.

use std::fmt;
use std::path::Path;

use toml::Spanned;

use super::ConfigError;

/// Turns byte offsets into the `file:line:column` a person can open.
pub(super) struct Source<'a> {
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
}

impl Source<'_> {
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
