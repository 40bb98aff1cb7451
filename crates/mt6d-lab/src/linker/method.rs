//! The methods the linker scores, and their groups.

/// Every way the linker tries to tie two epochs together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Method {
    /// The outer IPv6 flow label (RFC 6437): same values in both epochs.
    FlowLabel,
    /// The outer traffic class.
    TrafficClass,
    /// The outer hop limit.
    HopLimit,
    /// The distribution of outer payload lengths in the two flows.
    PayloadLength,
    /// The UDP port of each side: a port kept or reused across the switch.
    UdpPorts,
    /// Bits of the interface identifiers that agree between the two epochs' addresses.
    IidBits,
    /// The first 8 bytes of the UDP payload as a big-endian counter: the next epoch's first
    /// value continues the previous epoch's last.
    Counter,
    /// The first payload byte (a message type or key-phase bit in clear).
    FirstByte,
    /// Any 16-bit word of the payload's first 32 bytes at the same offset in both epochs:
    /// in auth and plain modes the inner IPv6 and transport headers (flow label, ports,
    /// sequence numbers, echo identifiers) are there in clear.
    PayloadWords,
    /// The sizes of the last packets before the switch against the first after it.
    PacketSizes,
    /// Each sender's last packet of one epoch against its first of the next: a stream that
    /// switches at its own moment (per-stream timing) hands over with no gap.
    Handover,
    /// Router and neighbour solicitations and advertisements naming addresses of both flows.
    NeighborDiscovery,
    /// ICMPv6 Redirects (RFC 4861 §8) naming addresses of both flows: target, destination,
    /// outer source and destination.
    Redirects,
    /// MLD reports naming (the solicited-node groups of) addresses of both flows.
    MldReports,
    /// ICMPv6 errors whose outer and quoted addresses belong to both flows.
    IcmpErrors,
    /// The place of a flow's control message (a tunnel payload of at most
    /// [`CONTROL_PAYLOAD`](super::CONTROL_PAYLOAD) bytes: link-layer announcement, notice, keepalive; or a neighbour
    /// solicitation or advertisement naming one of its addresses) among its sender's control
    /// messages of the same kind for that epoch: a daemon that sends them in a fixed order
    /// gives a stream the same place every epoch.
    ControlOrder,
    /// The time of a flow's control message from its epoch's boundary (the first packet of
    /// any flow of that epoch): a stream whose messages leave at its own offset keeps it.
    ControlOffset,
    /// Byte-identical payloads (the first 16 bytes) seen in both flows: a message re-sent
    /// unchanged across the switch names both epochs.
    Repeats,
    /// Bytes per epoch, per sender: a bulk transfer stays a bulk transfer.
    Bytes,
    /// Packets per epoch, per sender.
    Packets,
    /// The distribution of wire sizes in 64-byte bins (1 - total variation distance).
    SizeDistribution,
    /// A periodic sender's phase across the switch: the candidate whose first packets continue
    /// the unit's dominant period at the unit's phase.
    TimingPhase,
    /// The gap between the last packets before the switch against the first after it.
    SwitchGap,
    /// The coefficient of variation of the inter-packet gaps (timer, Poisson, bursts).
    Burstiness,
    /// Sizes and gaps of the last 8 packets against the next unit's first 8 (DeepCorr's
    /// input, as a distance).
    EdgeShape,
    /// k nearest neighbours over the other traffic methods' scores of a pair, trained on
    /// labelled pairs of another capture (present only when a classifier is given).
    Classifier,
}

impl Method {
    pub const ALL: [Method; 26] = [
        Method::FlowLabel,
        Method::TrafficClass,
        Method::HopLimit,
        Method::PayloadLength,
        Method::UdpPorts,
        Method::IidBits,
        Method::Counter,
        Method::FirstByte,
        Method::PayloadWords,
        Method::PacketSizes,
        Method::Handover,
        Method::NeighborDiscovery,
        Method::Redirects,
        Method::MldReports,
        Method::IcmpErrors,
        Method::ControlOrder,
        Method::ControlOffset,
        Method::Repeats,
        Method::Bytes,
        Method::Packets,
        Method::SizeDistribution,
        Method::TimingPhase,
        Method::SwitchGap,
        Method::Burstiness,
        Method::EdgeShape,
        Method::Classifier,
    ];

    /// Traffic analysis: the methods that read only the times and sizes of the packets a
    /// conversation sends, as a flow correlator does on any encrypted tunnel, and the
    /// classifier trained on them. They are reported, not yet held to a margin: an identical
    /// route for every conversation of a gateway pair is what will take them to chance.
    pub const TRAFFIC: [Method; 8] = [
        Method::Bytes,
        Method::Packets,
        Method::SizeDistribution,
        Method::TimingPhase,
        Method::SwitchGap,
        Method::Burstiness,
        Method::EdgeShape,
        Method::Classifier,
    ];

    /// The methods that read what the daemon itself schedules (its control messages), not the
    /// traffic it carries.
    pub const CONTROL: [Method; 3] = [Method::ControlOrder, Method::ControlOffset, Method::Repeats];

    pub fn name(self) -> &'static str {
        match self {
            Method::FlowLabel => "outer flow label",
            Method::TrafficClass => "traffic class",
            Method::HopLimit => "hop limit",
            Method::PayloadLength => "payload length distribution",
            Method::UdpPorts => "UDP ports",
            Method::IidBits => "IID bits",
            Method::Counter => "counter (first 8 payload bytes)",
            Method::FirstByte => "first payload byte",
            Method::PayloadWords => "payload words (first 32 bytes)",
            Method::PacketSizes => "packet sizes at the switch",
            Method::Handover => "handover time",
            Method::NeighborDiscovery => "neighbour discovery pairing",
            Method::Redirects => "ICMPv6 redirects",
            Method::MldReports => "MLD reports",
            Method::IcmpErrors => "ICMPv6 errors quoting epochs",
            Method::ControlOrder => "control message order",
            Method::ControlOffset => "control message offset from the boundary",
            Method::Repeats => "byte-identical repeats",
            Method::Bytes => "bytes per epoch",
            Method::Packets => "packets per epoch",
            Method::SizeDistribution => "size distribution (64-byte bins)",
            Method::TimingPhase => "timing phase across the switch",
            Method::SwitchGap => "inter-packet gap at the switch",
            Method::Burstiness => "burstiness (gap variation)",
            Method::EdgeShape => "first/last 8 packets (sizes, gaps)",
            Method::Classifier => "classifier (k-NN, trained on another run)",
        }
    }
}
