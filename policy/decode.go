package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Documents written by people (task files, recipes) may be YAML; documents written by
// programs (--env-params, the admin API) are JSON. Both decode to the same generic tree,
// so one validator serves both: map[string]any, []any, string, json.Number, bool, nil.

// DecodeJSON decodes exactly one JSON value. Unlike encoding/json it refuses duplicate
// object keys, because "last one wins" would let a second network_mode hide behind a
// first one that a reviewer read.
func DecodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSONValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("invalid JSON: unexpected data after the first value")
	}
	return v, nil
}

func decodeJSONValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("invalid JSON: no value")
		}
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	switch t := tok.(type) {
	case json.Delim:
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
					return nil, fmt.Errorf("invalid JSON: the key %q appears twice in one object", key)
				}
				v, err := decodeJSONValue(dec)
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
				v, err := decodeJSONValue(dec)
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
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("invalid YAML: the document is empty")
		}
		return nil, fmt.Errorf("invalid YAML: %w", err)
	}
	// A second document would otherwise be dropped without a word.
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		return nil, fmt.Errorf("invalid YAML: the file holds more than one document; put several entries in one list")
	}
	return yamlToGeneric(&root)
}

func yamlToGeneric(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.DocumentNode:
		return yamlToGeneric(n.Content[0])
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
				return nil, fmt.Errorf("invalid YAML: line %d: the key %q appears twice in one mapping", k.Line, k.Value)
			}
			v, err := yamlToGeneric(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			obj[k.Value] = v
		}
		return obj, nil
	case yaml.SequenceNode:
		arr := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := yamlToGeneric(c)
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
			return json.Number(n.Value), nil
		case "!!bool":
			var b bool
			if err := n.Decode(&b); err != nil {
				return nil, fmt.Errorf("invalid YAML: line %d: %w", n.Line, err)
			}
			return b, nil
		case "!!null":
			return nil, nil
		}
		return nil, fmt.Errorf("invalid YAML: line %d: unsupported tag %s", n.Line, n.ShortTag())
	}
	return nil, fmt.Errorf("invalid YAML: line %d: unsupported node", n.Line)
}

// DecodeDocument decodes a JSON or YAML document; JSON is recognised by its first
// non-blank character, so JSON input gets JSON's stricter errors.
func DecodeDocument(data []byte) (any, error) {
	trimmed := strings.TrimLeft(string(data), " \t\r\n")
	if trimmed != "" && strings.ContainsRune("{[\"", rune(trimmed[0])) {
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

// display renders a generic value for an error message: strings quoted, others as JSON.
func display(v any) string {
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 80 {
		return string(b[:77]) + "..."
	}
	return string(b)
}
