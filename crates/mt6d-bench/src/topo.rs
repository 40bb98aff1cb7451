//! The three topologies of 000 §4.1, built fresh for every scenario so no state leaks from one
//! scenario into the next. The builders are the lab's (crates/mt6d-lab/src/topology.rs), shared
//! with `mt6d demo` and the end-to-end tests; the bench adds what only it needs: the switched
//! gateways' public addresses (the WireGuard endpoints) and GRO on every veth.

pub use mt6d_lab::topology::{Lab as Net, Topology, EXTERNAL_IF as EXT_IF, INTERNAL_IF as INT_IF};

/// Builds `topology` with the bench's namespace names (`mb..`, which its reaper looks for).
pub fn build(topology: Topology) -> Result<Net, String> {
    let net = Net::build_topology(topology, "mb").map_err(|e| e.to_string())?;
    net.add_public_addresses().map_err(|e| e.to_string())?;
    // GRO on every veth, alike for every scenario.
    net.enable_gro();
    Ok(net)
}
