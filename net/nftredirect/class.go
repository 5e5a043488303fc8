package nftredirect

// Class names a kind of dropped packet; each has a named counter in the table.
type Class string

// The drop classes, in the order the rules test them.
const (
	ClassSpoofed Class = "spoofed" // source is not the agent's end of the link
	ClassUDP     Class = "udp"     // UDP to a port other than 53 (QUIC included)
	ClassICMP    Class = "icmp"    // ICMP
	ClassOther   Class = "other"   // IPv6, and IPv4 protocols other than TCP, UDP and ICMP
)

// Classes lists every drop class.
var Classes = []Class{ClassSpoofed, ClassUDP, ClassICMP, ClassOther}

// Counts is what one class's counter has seen since the table was created.
type Counts struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}
