package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Documents written by people (task files, recipes) may be YAML; documents written by
// programs (--env-params, the admin API) are JSON. Both decode to the same generic tree,
// so one validator serves both: map[string]any, []any, string, json.Number, bool, nil.

// maxDepth is how deeply lists and objects may nest in a document. The deepest document
// the package reads needs 6 levels (a task list, a task, evaluation_environment, its
// policy, the host list, a target object); 32 leaves room for formats to grow while
// refusing a crafted document early, since everything that walks the tree afterwards
// (validation, error messages, the caller's own code) may recurse once per level.
const maxDepth = 32

// deepErr is the rule that a document nesting past maxDepth breaks.
var deepErr = fmt.Sprintf("nesting deeper than %d levels", maxDepth)

// maxValues is how many values (lists, objects and scalars) a JSON document may hold:
// ten times the 100,000-entry allowlists of `make bench-proxy`. Decoding costs about a
// microsecond and 200 bytes per value, so a 32 MiB admin request of small numbers, 16
// million values, took 16 s and 3.5 GB before this bound refused it after a million.
const maxValues = 1 << 20

// maxYAMLBytes bounds a YAML document. yaml.v3 builds its whole node tree before
// anything can count it, at about 150 bytes of memory per byte of input; a 32 MiB
// list took 20 s and 4.7 GB. Large generated documents are JSON.
const maxYAMLBytes = 1 << 20

// DecodeJSON decodes exactly one JSON value. Unlike encoding/json it refuses duplicate
// object keys, because "last one wins" would let a second network_mode hide behind a
// first one that a reviewer read.
func DecodeJSON(data []byte) (any, error) {
	return decodeJSON(data, maxValues)
}

// decodeJSON is DecodeJSON with a bound of limit values.
func decodeJSON(data []byte, limit int) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	d := jsonDecoder{dec: dec, left: limit, limit: limit}
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("invalid JSON: unexpected data after the first value")
	}
	return v, nil
}

// jsonDecoder reads one document's values, counting them against its bound.
type jsonDecoder struct {
	dec         *json.Decoder
	left, limit int
}

// value decodes the next value, which sits inside depth lists and objects.
func (d *jsonDecoder) value(depth int) (any, error) {
	dec := d.dec
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("invalid JSON: no value")
		}
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if d.left--; d.left < 0 {
		return nil, fmt.Errorf("invalid JSON: byte offset %d: more than %d values in one document", dec.InputOffset(), d.limit)
	}
	switch t := tok.(type) {
	case json.Delim:
		if (t == '{' || t == '[') && depth == maxDepth {
			// The offset is the delimiter's own: the decoder has just read past it.
			return nil, fmt.Errorf("invalid JSON: byte offset %d: %s", dec.InputOffset()-1, deepErr)
		}
		switch t {
		case '{':
			obj := map[string]any{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, fmt.Errorf("invalid JSON: %w", err)
				}
				key := kt.(string)
				if _, dup := obj[key]; dup {
					return nil, fmt.Errorf("invalid JSON: the key %s appears twice in one object", Quote(key))
				}
				v, err := d.value(depth + 1)
				if err != nil {
					return nil, err
				}
				obj[key] = v
			}
			_, err := dec.Token()
			return obj, wrapJSON(err)
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := d.value(depth + 1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token()
			return arr, wrapJSON(err)
		}
		return nil, fmt.Errorf("invalid JSON: unexpected %q", t)
	default:
		return t, nil
	}
}

func wrapJSON(err error) error {
	if err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	return nil
}

// DecodeYAML decodes one YAML document into the generic tree, refusing duplicate keys as
// DecodeJSON does (yaml.v3 checks them only when decoding into Go maps); tags are mapped so that numbers stay numbers (json.Number) and
// everything else keeps the type a JSON reader would give it.
func DecodeYAML(data []byte) (any, error) {
	if len(data) > maxYAMLBytes {
		return nil, fmt.Errorf("invalid YAML: %d bytes: a YAML document may hold at most %d; write a larger one as JSON", len(data), maxYAMLBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("invalid YAML: the document is empty")
		}
		// Clipped: some of yaml.v3's errors quote the input ("unknown anchor '...'
		// referenced").
		return nil, fmt.Errorf("invalid YAML: %s", Clip(err.Error()))
	}
	// A second document would otherwise be dropped without a word.
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		return nil, fmt.Errorf("invalid YAML: the file holds more than one document; put several entries in one list")
	}
	return yamlToGeneric(&root, 0)
}

// yamlToGeneric converts n, which sits inside depth sequences and mappings. yaml.v3 has
// already refused more than 10000 levels while parsing; maxDepth is checked here. Aliases
// are refused outright, so an alias bomb ("billion laughs") is never expanded: yaml.v3
// itself only links an alias to its anchor's node when it builds a yaml.Node tree.
func yamlToGeneric(n *yaml.Node, depth int) (any, error) {
	if (n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode) && depth == maxDepth {
		return nil, fmt.Errorf("invalid YAML: line %d: %s", n.Line, deepErr)
	}
	switch n.Kind {
	case yaml.DocumentNode:
		return yamlToGeneric(n.Content[0], depth)
	case yaml.AliasNode:
		return nil, fmt.Errorf("invalid YAML: line %d: aliases are not supported", n.Line)
	case yaml.MappingNode:
		obj := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
				return nil, fmt.Errorf("invalid YAML: line %d: keys must be strings", k.Line)
			}
			if _, dup := obj[k.Value]; dup {
				return nil, fmt.Errorf("invalid YAML: line %d: the key %s appears twice in one mapping", k.Line, Quote(k.Value))
			}
			v, err := yamlToGeneric(n.Content[i+1], depth+1)
			if err != nil {
				return nil, err
			}
			obj[k.Value] = v
		}
		return obj, nil
	case yaml.SequenceNode:
		arr := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := yamlToGeneric(c, depth+1)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		return arr, nil
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!str":
			return n.Value, nil
		case "!!int", "!!float":
			if hasLeadingZero(n.Value) {
				return nil, fmt.Errorf("invalid YAML: line %d: the number %s has a leading zero, which YAML 1.1 readers (and yaml.v3) take as octal and YAML 1.2 readers as decimal; write it without the zero", n.Line, Clip(n.Value))
			}
			return json.Number(n.Value), nil
		case "!!bool":
			var b bool
			if err := n.Decode(&b); err != nil {
				// Clipped: the error quotes the scalar ("cannot decode !!str `...` as a !!bool").
				return nil, fmt.Errorf("invalid YAML: line %d: %s", n.Line, Clip(err.Error()))
			}
			return b, nil
		case "!!null":
			return nil, nil
		}
		return nil, fmt.Errorf("invalid YAML: line %d: unsupported tag %s", n.Line, Clip(n.ShortTag()))
	}
	return nil, fmt.Errorf("invalid YAML: line %d: unsupported node", n.Line)
}

// hasLeadingZero reports whether a YAML number is written with a leading zero ("0443",
// "-0443", "0_443"): one document would then mean 443 to us and 291 to its other readers,
// so it is refused rather than read either way.
func hasLeadingZero(s string) bool {
	if s != "" && (s[0] == '+' || s[0] == '-') {
		s = s[1:]
	}
	return len(s) >= 2 && s[0] == '0' && (s[1] >= '0' && s[1] <= '9' || s[1] == '_')
}

// DecodeDocument decodes a JSON or YAML document; JSON is recognised by its first
// non-blank character, so JSON input gets JSON's stricter errors (and JSON's bounds,
// not YAML's). A UTF-8 byte order mark, which some editors write, is skipped.
func DecodeDocument(data []byte) (any, error) {
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) > 0 && bytes.IndexByte([]byte("{[\""), trimmed[0]) >= 0 {
		return DecodeJSON(data)
	}
	return DecodeYAML(data)
}

// describe names a generic value's type for error messages.
func describe(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// Display renders a decoded value (see DecodeDocument) for an error message as this
// package's own errors do: strings quoted, anything else as JSON, both cut short.
func Display(v any) string { return display(v) }

// displayMax is how much of a value an error message shows.
const displayMax = 80

// display renders a generic value for an error message: strings quoted and clipped to
// fragmentMax bytes, others as the JSON that encoding/json would write, cut to displayMax
// bytes. The JSON is written only as far as the cut, so neither a huge value nor a deep
// one costs more than that.
func display(v any) string {
	if s, ok := v.(string); ok {
		return Quote(s)
	}
	var w displayWriter
	w.value(v)
	if len(w.buf) > displayMax {
		// The cut moves back to the start of a character it would split, so the message
		// stays valid UTF-8 (the JSON written is: strings go through encoding/json).
		cut := displayMax - 3
		for cut > 0 && !utf8.RuneStart(w.buf[cut]) {
			cut--
		}
		return string(w.buf[:cut]) + "..."
	}
	return string(w.buf)
}

// displayWriter writes JSON until it holds more than displayMax bytes, then ignores the
// rest. Every level of nesting writes at least one byte before descending, so the walk
// goes at most displayMax+1 levels deep whatever the value's depth.
type displayWriter struct{ buf []byte }

func (w *displayWriter) full() bool { return len(w.buf) > displayMax }

func (w *displayWriter) value(v any) {
	if w.full() {
		return
	}
	switch x := v.(type) {
	case nil:
		w.buf = append(w.buf, "null"...)
	case bool:
		w.buf = strconv.AppendBool(w.buf, x)
	case json.Number:
		// Written as it stands, like encoding/json does, and also when it is not a JSON
		// number (YAML's 0x1F, .inf): encoding/json would refuse the whole value then.
		if x == "" {
			x = "0"
		}
		w.buf = append(w.buf, x[:min(len(x), displayMax+1)]...)
	case string:
		w.string(x)
	case []any:
		w.buf = append(w.buf, '[')
		for i, e := range x {
			if w.full() {
				return
			}
			if i > 0 {
				w.buf = append(w.buf, ',')
			}
			w.value(e)
		}
		w.buf = append(w.buf, ']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		w.buf = append(w.buf, '{')
		for i, k := range keys {
			if w.full() {
				return
			}
			if i > 0 {
				w.buf = append(w.buf, ',')
			}
			w.string(k)
			w.buf = append(w.buf, ':')
			w.value(x[k])
		}
		w.buf = append(w.buf, '}')
	default:
		// The decoders return no other type; name it rather than walk it.
		w.buf = fmt.Appendf(w.buf, "%T", v)
	}
}

// string writes s as encoding/json quotes it (HTML characters escaped, invalid UTF-8 as
// U+FFFD). Only its first displayMax+1 bytes can show: escaping never shortens text, and
// a character cut in two by the prefix starts at byte displayMax-2 or later, which lands
// past the cut of the output.
func (w *displayWriter) string(s string) {
	b, _ := json.Marshal(s[:min(len(s), displayMax+1)]) // a string always marshals
	w.buf = append(w.buf, b...)
}
