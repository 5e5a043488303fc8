package policy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// fragmentMax is how many bytes of one user-supplied string (a value, an object key, a
// part of a target) an error message shows. The longest valid one is a target: a DNS
// name of at most 253 characters with "*." in front and ":65535" behind, 261 bytes in
// its ASCII form, and up to about four times that written in Unicode (an IDN as the user
// wrote it). At 1024 every valid value shows whole and only text that is wrong anyway is
// cut, such as a 32 MiB string sent to the proxy's admin API, which would otherwise come
// back, and be logged, as a 32 MiB error message.
const fragmentMax = 1024

// Clip returns s whole when it fits in fragmentMax bytes, and otherwise its start
// followed by "…(N more bytes)". Characters that break or hide lines (a key or a YAML
// scalar may hold newlines) and bytes that are not UTF-8 (a YAML tag may percent-encode
// any) are written as Go escapes, so one fragment is one line of valid UTF-8.
func Clip(s string) string {
	head, more := clipParts(s)
	return escapeUnprintable(head) + more
}

// escapeUnprintable writes control characters, U+2028, U+2029 and bytes that are not
// UTF-8 as Go escapes (\n, \u2028, \xc0), and everything else as it is.
func escapeUnprintable(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, breaksLine) < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case breaksLine(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func breaksLine(r rune) bool { return unicode.IsControl(r) || r == '\u2028' || r == '\u2029' }

// Quote is %q of Clip(s): the quoted text is the start of s as written, and the count of
// bytes left out follows the closing quote.
func Quote(s string) string {
	head, more := clipParts(s)
	return strconv.Quote(head) + more
}

// clipParts splits a long s into its first fragmentMax bytes, cut back to a character
// boundary so that the message stays valid UTF-8, and the marker for the rest.
func clipParts(s string) (head, more string) {
	if len(s) <= fragmentMax {
		return s, ""
	}
	cut := fragmentMax
	// A character is at most utf8.UTFMax bytes; invalid UTF-8 has no boundary to find.
	for i := 1; i < utf8.UTFMax && !utf8.RuneStart(s[cut]); i++ {
		cut--
	}
	return s[:cut], fmt.Sprintf("…(%d more bytes)", len(s)-cut)
}

// FieldError is one validation failure. It names where the bad value sits (Path, for
// example "run_network_policy.allowed_hosts[2]"), the value as the user wrote it, and
// the rule it broke, so a user can fix the input without reading our code.
type FieldError struct {
	Path  string // dotted path of the offending field; empty for a top-level value
	Value string // the offending value, already quoted for display; may be empty
	Rule  string // what is wrong, in words

	// more is set on the last entry of a full ErrorList, which stands for the errors
	// left out of it: how many ("and 12 more errors").
	more int
	// entry is 1 + the index of the host-list entry a provider refused, 0 for none: the
	// planner tells an entry a recipe added from one the policy was written with.
	entry int
}

func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString(e.Path)
	if e.Value != "" {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(e.Value)
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	b.WriteString(e.Rule)
	return b.String()
}

// ErrorList collects the FieldErrors found in one input, in input order, so that a user
// sees all problems at once rather than one per attempt: the first maxErrors of them, and
// then one entry that counts the rest.
type ErrorList []*FieldError

// maxErrors is how many errors an ErrorList keeps. A user fixes the first ones first, and
// a list of a million bad entries (the proxy's admin API takes 32 MiB) should cost
// neither a million errors' memory nor a message a million lines long.
const maxErrors = 100

// add appends errors to the list while it holds fewer than maxErrors, and counts any
// after that in a last entry "and N more errors". An entry that counts errors left out of
// another list (a nested check's result) adds its count, so the total stays exact; once
// anything is left out, everything after it is too, so what is shown is a prefix.
func (l *ErrorList) add(fes ...*FieldError) {
	for _, fe := range fes {
		n := len(*l)
		switch {
		case n > 0 && (*l)[n-1].more > 0:
			(*l)[n-1].countMore(max(fe.more, 1))
		case fe.more > 0:
			c := *fe // the nested list's entry stays as it was
			*l = append(*l, &c)
		case n < maxErrors:
			*l = append(*l, fe)
		default:
			c := &FieldError{}
			c.countMore(1)
			*l = append(*l, c)
		}
	}
}

// countMore adds n errors to the count of an entry that stands for left-out errors.
func (e *FieldError) countMore(n int) {
	e.more += n
	if e.more == 1 {
		e.Rule = "and 1 more error"
	} else {
		e.Rule = "and " + strconv.Itoa(e.more) + " more errors"
	}
}

func (l ErrorList) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// err returns nil for an empty list, so callers can `return l.err()`.
func (l ErrorList) err() error {
	if len(l) == 0 {
		return nil
	}
	return l
}

// FieldErrors flattens err into its FieldErrors: an ErrorList, a single *FieldError, or
// nil for any other error.
func FieldErrors(err error) []*FieldError {
	var l ErrorList
	if errors.As(err, &l) {
		return l
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		return []*FieldError{fe}
	}
	return nil
}

// joinPath appends a key to a dotted path.
func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
