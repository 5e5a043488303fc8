package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// Kind says which part of a destination a Target matches.
type Kind uint8

const (
	// KindHost matches one hostname exactly (the requested name, not an address).
	KindHost Kind = iota + 1
	// KindWildcard matches every name with one or more labels in front of Host,
	// never Host itself.
	KindWildcard
	// KindAddr matches one IP address: the address actually dialled.
	KindAddr
	// KindPrefix matches a canonical CIDR range of dialled addresses.
	KindPrefix
)

func (k Kind) String() string {
	switch k {
	case KindHost:
		return "host"
	case KindWildcard:
		return "wildcard"
	case KindAddr:
		return "ip"
	case KindPrefix:
		return "cidr"
	}
	return "invalid"
}

// Target is one canonical policy entry.
type Target struct {
	Kind Kind
	// Port is the one port the target covers; 0 means every port.
	Port uint16
	// Host is the canonical hostname for KindHost, and the suffix after "*." for
	// KindWildcard: lower-case, no trailing dot, IDN labels in punycode.
	Host string
	// Prefix is the address (as a full-length prefix) for KindAddr, and the masked
	// prefix for KindPrefix.
	Prefix netip.Prefix
}

// IsAddress reports whether t matches dialled addresses rather than requested names.
func (t Target) IsAddress() bool { return t.Kind == KindAddr || t.Kind == KindPrefix }

// HostString is the target without its port: "pypi.org", "*.example.com",
// "2001:db8::1", "203.0.113.0/24".
func (t Target) HostString() string {
	switch t.Kind {
	case KindHost:
		return t.Host
	case KindWildcard:
		return "*." + t.Host
	case KindAddr:
		return t.Prefix.Addr().String()
	case KindPrefix:
		return t.Prefix.String()
	}
	return ""
}

// String is the canonical wire form: "host", "host:port", or "[v6]:port" (brackets only
// when an IPv6 address or range carries a port).
func (t Target) String() string {
	h := t.HostString()
	if t.Port == 0 {
		return h
	}
	if t.IsAddress() && t.Prefix.Addr().Is6() {
		h = "[" + h + "]"
	}
	return h + ":" + strconv.Itoa(int(t.Port))
}

// ParseTarget parses one target written as a string ("host", "host:port", "[v6]:port",
// "*.suffix", "203.0.113.0/24") into its canonical form. The error's Rule says which rule
// of the policy language the input broke; its Path is left for the caller to fill in.
func ParseTarget(s string) (Target, error) {
	host, port, err := splitHostPort(s)
	if err != nil {
		return Target{}, err
	}
	t, err := parseHost(host)
	if err != nil {
		return Target{}, err
	}
	t.Port = port
	return t, nil
}

func ruleErr(format string, args ...any) *FieldError {
	return &FieldError{Rule: fmt.Sprintf(format, args...)}
}

// splitHostPort separates an optional port, enforcing the bracket rule for IPv6.
func splitHostPort(s string) (string, uint16, error) {
	if s == "" {
		return "", 0, ruleErr("an empty target is not allowed")
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
		return "", 0, ruleErr("whitespace and control characters are not allowed")
	}
	if !utf8.ValidString(s) {
		return "", 0, ruleErr("the target is not valid UTF-8")
	}
	if strings.Contains(s, "://") {
		return "", 0, ruleErr("a URL scheme is not allowed: write the host alone, e.g. %s", Quote(hostOfURL(s)))
	}
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", 0, ruleErr("an opening '[' has no closing ']'")
		}
		inner, rest := s[1:end], s[end+1:]
		if a, err := netip.ParsePrefix(inner); err == nil && a.Addr().Is6() {
			// a bracketed IPv6 CIDR
		} else if a, err := netip.ParseAddr(inner); err != nil || !a.Is6() {
			return "", 0, ruleErr("brackets are only for an IPv6 address or range")
		}
		if rest == "" {
			return inner, 0, nil
		}
		if !strings.HasPrefix(rest, ":") {
			return "", 0, ruleErr("only ':port' may follow ']'")
		}
		p, err := parsePortString(rest[1:])
		return inner, p, err
	}
	switch strings.Count(s, ":") {
	case 0:
		return s, 0, nil
	case 1:
		i := strings.IndexByte(s, ':')
		p, err := parsePortString(s[i+1:])
		return s[:i], p, err
	}
	// Two or more colons: an IPv6 address or range, written without brackets.
	if _, err := netip.ParseAddr(s); err == nil {
		return s, 0, nil
	}
	if _, err := netip.ParsePrefix(s); err == nil {
		return s, 0, nil
	}
	if i := strings.LastIndexByte(s, ':'); i > 0 {
		if _, err := netip.ParseAddr(s[:i]); err == nil {
			return "", 0, ruleErr("an IPv6 address with a port needs brackets: [%s]:%s", Clip(s[:i]), Clip(s[i+1:]))
		}
		if _, err := netip.ParsePrefix(s[:i]); err == nil {
			return "", 0, ruleErr("an IPv6 range with a port needs brackets: [%s]:%s", Clip(s[:i]), Clip(s[i+1:]))
		}
	}
	return "", 0, ruleErr("not a valid IPv6 address or range")
}

func hostOfURL(s string) string {
	rest := s[strings.Index(s, "://")+3:]
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

func parsePortString(p string) (uint16, error) {
	if p == "" {
		return 0, ruleErr("the port after ':' is empty")
	}
	for _, c := range p {
		if c < '0' || c > '9' {
			return 0, ruleErr("the port %s is not an integer", Quote(p))
		}
	}
	n, err := strconv.ParseUint(p, 10, 32)
	if err != nil || n < 1 || n > 65535 {
		return 0, ruleErr("the port %s is outside 1..65535", Clip(p))
	}
	return uint16(n), nil
}

// idnFullStops are the characters other than '.' that IDNA maps to the label separator.
var idnFullStops = []string{"\u3002", "\uff0e", "\uff61"}

// parseHost classifies the part of a target in front of its port.
func parseHost(h string) (Target, error) {
	if h == "" {
		return Target{}, ruleErr("the host is empty")
	}
	if strings.Contains(h, "/") {
		return parsePrefix(h)
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return Target{}, ruleErr("an IPv6 zone (%%%s) is not allowed", Clip(a.Zone()))
		}
		a = a.Unmap()
		return Target{Kind: KindAddr, Prefix: netip.PrefixFrom(a, a.BitLen())}, nil
	}
	for _, stop := range idnFullStops {
		// The label separator after the wildcard may be written as any full stop IDNA
		// maps to '.', as it may between the other labels.
		if rest, ok := strings.CutPrefix(h, "*"+stop); ok {
			h = "*." + rest
		}
	}
	if base, ok := strings.CutPrefix(h, "*."); ok {
		if strings.Contains(base, "*") {
			return Target{}, ruleErr("only a single leading '*.' label is allowed")
		}
		if _, err := netip.ParseAddr(base); err == nil {
			return Target{}, ruleErr("a wildcard applies to host names, not to addresses: use a CIDR")
		}
		suffix, err := policyHostname(base)
		if err != nil {
			return Target{}, err
		}
		return Target{Kind: KindWildcard, Host: suffix}, nil
	}
	switch {
	case h == "*":
		return Target{}, ruleErr("a bare '*' is not allowed: use network_mode public or denylist")
	case strings.HasPrefix(h, "*"):
		return Target{}, ruleErr("a wildcard must be a whole leading label, as in \"*.example.com\"")
	case strings.Contains(h, "*"):
		return Target{}, ruleErr("only a leading wildcard is allowed (\"*.example.com\"), not an embedded or trailing one")
	}
	name, err := policyHostname(h)
	if err != nil {
		return Target{}, err
	}
	return Target{Kind: KindHost, Host: name}, nil
}

// policyHostname is CanonicalHostname for a name written in a policy, which must also
// spell every "xn--" label as a valid A-label (the punycode of a valid internationalised
// label). "xn--zz" is a typo no Unicode name maps to, so a rule naming it could never
// match the name its author meant. Requested names are not held to this: a client's odd
// name matches no rule and is decided like any other unlisted name.
func policyHostname(h string) (string, error) {
	name, err := CanonicalHostname(h)
	if err != nil {
		return "", err
	}
	for _, label := range strings.Split(name, ".") {
		if !strings.HasPrefix(label, "xn--") {
			continue
		}
		// Checked one label at a time: the name's other labels follow the LDH rules of
		// checkLabel, which IDNA's hyphen checks would refuse in part ("ab--cd").
		if _, err := idnaProfile.ToASCII(label); err != nil {
			return "", ruleErr("the label %s is not a valid IDN A-label (%s)", Quote(label), Clip(err.Error()))
		}
	}
	return name, nil
}

func parsePrefix(h string) (Target, error) {
	addr, bits, _ := strings.Cut(h, "/")
	a, err := netip.ParseAddr(addr)
	if err != nil {
		if IsNonCanonicalIPv4(addr) {
			return Target{}, ruleErr("an IPv4 address must be written in dotted-decimal form (a.b.c.d), not %s", Quote(addr))
		}
		return Target{}, ruleErr("a path is not allowed: write the host alone")
	}
	// Checked here: netip.ParsePrefix refuses a zone as a bad prefix length.
	if a.Zone() != "" {
		return Target{}, ruleErr("an IPv6 zone (%%%s) is not allowed", Clip(a.Zone()))
	}
	p, err := netip.ParsePrefix(h)
	if err != nil {
		return Target{}, ruleErr("the prefix length /%s is not valid for this address", Clip(bits))
	}
	if m := p.Masked(); m != p {
		return Target{}, ruleErr("a CIDR must be canonical (host bits zero): did you mean %s?", m)
	}
	// An IPv4-mapped range names IPv4 addresses: written as IPv4, rules and dialled
	// addresses compare like for like.
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	if p.IsSingleIP() {
		return Target{Kind: KindAddr, Prefix: p}, nil
	}
	return Target{Kind: KindPrefix, Prefix: p}, nil
}

// maxUnicodeName bounds a name written with non-ASCII characters: 1 KiB holds its 253
// characters at 4 bytes each, the most a character that maps to one character takes.
const maxUnicodeName = 1024

// idnaProfile maps and validates internationalised names the way resolvers see them.
var idnaProfile = idna.New(idna.MapForLookup(), idna.Transitional(false), idna.BidiRule(), idna.StrictDomainName(false))

// The reasons a requested host is refused before any rule is consulted, as the proxy
// and its DNS server give them.
const (
	ReasonInvalidHost    Reason = "invalid-host"          // not a valid host name or address
	ReasonNonCanonicalIP Reason = "non-canonical-address" // an address in decimal/octal/hex/short form
)

// CanonicalHostname returns the canonical form of a DNS name: lower-case, one trailing
// dot removed, IDN labels in punycode. It refuses names that are not valid hostnames,
// including names that an inet_aton-style parser would read as an IPv4 address in a
// non-canonical form ("127.1", "0x7f.0.0.1", "2130706433"). The proxy applies the same
// function to requested names, so a policy and a request always compare like for like.
func CanonicalHostname(h string) (string, error) {
	if h == "" {
		return "", ruleErr("the host name is empty")
	}
	written := h
	ascii := true
	for i := 0; i < len(h); i++ {
		if h[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if !ascii {
		// IDNA reads every invalid byte sequence as U+FFFD (which it refuses when written
		// as such) and would punycode it: "a\xff" and "a\xfe" would both be "xn--a-q10i",
		// a name the client never wrote. A policy's entries are refused likewise.
		if !utf8.ValidString(h) {
			return "", ruleErr("the host name is not valid UTF-8")
		}
		// IDNA's punycode step costs the square of a label's distinct characters (48
		// KiB took seconds), and a proxy client chooses the name: refuse first what no
		// valid name needs.
		if len(h) > maxUnicodeName {
			return "", ruleErr("the host name is longer than %d bytes as written; a host name has at most 253 characters", maxUnicodeName)
		}
		p, err := idnaProfile.ToASCII(h)
		if err != nil {
			return "", ruleErr("not a valid internationalised host name (%s)", Clip(err.Error()))
		}
		h = p
	}
	// Trimmed after IDNA mapping, which turns a trailing U+3002, U+FF0E or U+FF61 into
	// the root dot.
	h = strings.TrimSuffix(h, ".")
	if h == "" || strings.HasSuffix(h, ".") {
		return "", ruleErr("the host name has an empty label")
	}
	h = strings.ToLower(h)
	if len(h) > 253 {
		return "", ruleErr("the host name is longer than 253 characters")
	}
	for _, label := range strings.Split(h, ".") {
		if err := checkLabel(label); err != nil {
			return "", err
		}
	}
	if IsNonCanonicalIPv4(h) {
		// Dotted-decimal once canonical, so what is wrong is the spelling that was
		// trimmed or mapped away: a trailing dot, or digits IDNA mapped to ASCII.
		if a, err := netip.ParseAddr(h); err == nil {
			return "", ruleErr("%s is the IPv4 address %s: write it as a.b.c.d in ASCII digits, with no trailing dot", Quote(written), a)
		}
		return "", ruleErr("an IPv4 address must be written in dotted-decimal form (a.b.c.d), not %s", Quote(h))
	}
	return h, nil
}

func checkLabel(label string) error {
	if label == "" {
		return ruleErr("the host name has an empty label")
	}
	if len(label) > 63 {
		return ruleErr("the label %s is longer than 63 characters", Quote(label))
	}
	for i := 0; i < len(label); i++ {
		c := label[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_':
		case c == '-':
			if i == 0 || i == len(label)-1 {
				return ruleErr("the label %s starts or ends with '-'", Quote(label))
			}
		case c == '*':
			return ruleErr("'*' is only allowed as a whole leading label")
		case c == '/':
			return ruleErr("a path is not allowed: write the host alone")
		default:
			return ruleErr("the character %q is not allowed in a host name", rune(c))
		}
	}
	return nil
}

// IsNonCanonicalIPv4 reports whether name would be read as an IPv4 address by an
// inet_aton-style parser: one to four dot-separated decimal, octal or hex numbers. Such
// names are never looked up as names: they are a classic way to smuggle an address past
// a host rule.
func IsNonCanonicalIPv4(name string) bool {
	parts := strings.Split(strings.TrimSuffix(name, "."), ".")
	if len(parts) > 4 {
		return false
	}
	for _, p := range parts {
		if !isInetAtonNumber(p) {
			return false
		}
	}
	return true
}

func isInetAtonNumber(p string) bool {
	if p == "" {
		return false
	}
	digits := p
	hex := false
	if len(p) >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X') {
		digits, hex = p[2:], true
	}
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		switch {
		case c >= '0' && c <= '9':
		case hex && (c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'):
		default:
			return false
		}
	}
	return true
}
