//! The server role's pieces (tracker issue 12; docs/ARCHITECTURE.md, "The server role"). The
//! role itself (`role = "server"`) is not built yet; what is here is complete and tested on
//! its own, and is what the role will run.
//!
//! * [`ndp`]: answers Neighbour Solicitations for the currently valid hashed addresses only,
//!   where the server shares a segment with its router.

pub mod ndp;
