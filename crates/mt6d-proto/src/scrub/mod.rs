//! Identity scrubbing of TCP segments a gateway forwards (issue 14): reading and classifying TCP
//! options, including the HOST_ID forms of seed 004, RFC 7974's HOST_ID and TOA.

mod options;

pub use options::{
    kind, Boucadair, BoucadairData, HostIdKinds, Located, OptionError, TcpOption, TcpOptions,
    HOST_ID_EXID, TOA_LEN,
};
