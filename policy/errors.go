package policy

import (
	"errors"
	"strings"
)

// FieldError is one validation failure. It names where the bad value sits (Path, for
// example "run_network_policy.allowed_hosts[2]"), the value as the user wrote it, and
// the rule it broke, so a user can fix the input without reading our code.
type FieldError struct {
	Path  string // dotted path of the offending field; empty for a top-level value
	Value string // the offending value, already quoted for display; may be empty
	Rule  string // what is wrong, in words
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

// ErrorList collects every FieldError found in one input, in input order, so that a user
// sees all problems at once rather than one per attempt.
type ErrorList []*FieldError

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
