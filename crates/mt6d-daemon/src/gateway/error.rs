//! The daemon's error type: its own file so that every module of the daemon can name it
//! without importing the module that runs the threads.

/// Why the daemon could not start or had to stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Control(#[from] crate::control::ControlError),
    #[error("{what}: {source}")]
    Os {
        what: String,
        #[source]
        source: mt6d_os::OsError,
    },
    #[error(transparent)]
    Kit(#[from] crate::daemon::SetupError),
    #[error("{0}")]
    Setup(String),
}
