package policy

import "strings"

// The restriction statement's fixed lines, byte for byte from the harness guide
// ("Tell the Agent About Rollout Restrictions"). Each line inside the wrapper is
// indented by two spaces; target lines are "  - <target>".
const (
	noticeOpen   = "<IMPORTANT>\n"
	noticeHeader = "  Network Restriction Statement:\n" +
		"  Ignore any duplicate or conflicting declarations about network access elsewhere in the instructions; follow this statement instead.\n" +
		"  This statement has the highest priority for network access because it explicitly reflects the effective network policy applied to the task sandbox.\n"
	noticeClose = "</IMPORTANT>"

	noticeNoNetwork      = "  Outbound network access from the task environment is disabled. Use only resources already available in the environment. Do not repeatedly retry operations that require external network access.\n"
	noticeAllowlistIntro = "  Outbound network access from the task environment is restricted to the following targets:\n"
	noticeAllowlistEnd   = "  All other outbound targets are blocked. Do not repeatedly retry access to blocked targets.\n"
	noticeDenylistIntro  = "  Outbound network access from the task environment is available except for the following blocked targets:\n"
	noticeDenylistEnd    = "  Do not repeatedly retry access to these blocked targets.\n"
)

// RestrictionNotice is the network restriction statement for an effective run policy,
// or "" when none is due. The text starts with "<IMPORTANT>" and ends with
// "</IMPORTANT>" (no trailing newline); AppendNotice joins it to an instruction.
//
// public gets none; every restricting mode gets one. An allowlist with no targets allows
// nothing, so it gets the no-network text rather than an empty list; a denylist with no
// targets keeps the denylist text with no target lines (the agent still goes through the
// proxy, and on Docker has no direct route out).
func RestrictionNotice(run Policy) string {
	var b strings.Builder
	switch {
	case run.Mode == ModeNoNetwork, run.Mode == ModeAllowlist && len(run.Targets) == 0:
		b.WriteString(noticeOpen + noticeHeader + noticeNoNetwork)
	case run.Mode == ModeAllowlist:
		b.WriteString(noticeOpen + noticeHeader + noticeAllowlistIntro)
		writeTargetLines(&b, run)
		b.WriteString(noticeAllowlistEnd)
	case run.Mode == ModeDenylist:
		b.WriteString(noticeOpen + noticeHeader + noticeDenylistIntro)
		writeTargetLines(&b, run)
		b.WriteString(noticeDenylistEnd)
	default:
		return ""
	}
	b.WriteString(noticeClose)
	return b.String()
}

func writeTargetLines(b *strings.Builder, p Policy) {
	for _, t := range p.Targets {
		b.WriteString("  - ")
		b.WriteString(t.String())
		b.WriteByte('\n')
	}
}

// AppendNotice appends a restriction statement to the agent's final instruction,
// separated by a blank line; an empty notice leaves the instruction as it is.
func AppendNotice(instruction, notice string) string {
	if notice == "" {
		return instruction
	}
	if instruction == "" {
		return notice
	}
	return strings.TrimRight(instruction, "\n") + "\n\n" + notice
}
