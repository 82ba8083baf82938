package main

// The protobuf wire format as a tree the mutations edit: a message is its fields in order; a
// field keeps its number and wire type, and, once mutated, the exact bytes of its tag, its
// length or its value, so an encoding no encoder writes (an aliased tag, an overlong varint, a
// length past the end) is still one field of the tree.

import "fmt"

const (
	wtVarint     = 0
	wtFixed64    = 1
	wtBytes      = 2
	wtGroupStart = 3
	wtGroupEnd   = 4
	wtFixed32    = 5
)

type field struct {
	num uint64
	wt  uint64
	// tag, when set, is written instead of the canonical varint(num<<3 | wt).
	tag []byte
	// val is a varint field's value; raw, when set, is written instead of varint(val).
	val uint64
	// raw is a fixed or length-delimited field's payload (when msg is nil), or the bytes
	// written after the tag for wire types 3, 4, 6 and 7.
	raw []byte
	// msg is a length-delimited field's payload as a message the mutations descend into.
	msg *message
	// length, when set, is written instead of the payload's true length.
	length []byte
}

type message struct {
	role   string
	fields []*field
}

func putVarint(out []byte, v uint64) []byte {
	for v >= 0x80 {
		out = append(out, byte(v)|0x80)
		v >>= 7
	}
	return append(out, byte(v))
}

func varint(v uint64) []byte { return putVarint(nil, v) }

// padded is v's varint stretched to n bytes with continuation bytes (n > 10: Go's overflow).
func padded(v uint64, n int) []byte {
	out := varint(v)
	if len(out) >= n {
		return out
	}
	last := out[len(out)-1]
	out = out[:len(out)-1]
	out = append(out, last|0x80)
	for len(out) < n-1 {
		out = append(out, 0x80)
	}
	return append(out, 0x00)
}

// wide is a 10-byte varint whose low 64 bits are v and whose bits past 64 are high (1..63):
// Go drops those bits, an unbounded reader keeps them.
func wide(v uint64, high byte) []byte {
	out := make([]byte, 0, 10)
	for i := 0; i < 9; i++ {
		out = append(out, byte(v&0x7F)|0x80)
		v >>= 7
	}
	return append(out, byte(v&1)|(high<<1)&0x7F)
}

func (f *field) tagBytes() []byte {
	if f.tag != nil {
		return f.tag
	}
	return varint(f.num<<3 | f.wt)
}

func (f *field) payload() []byte {
	if f.msg != nil {
		return f.msg.encode()
	}
	return f.raw
}

func (m *message) encode() []byte {
	var out []byte
	for _, f := range m.fields {
		out = append(out, f.tagBytes()...)
		switch f.wt {
		case wtVarint:
			if f.raw != nil {
				out = append(out, f.raw...)
			} else {
				out = putVarint(out, f.val)
			}
		case wtBytes:
			p := f.payload()
			if f.length != nil {
				out = append(out, f.length...)
			} else {
				out = putVarint(out, uint64(len(p)))
			}
			out = append(out, p...)
		default:
			out = append(out, f.raw...)
		}
	}
	return out
}

// layout names the length-delimited fields parse descends into, with their roles.
type layout map[uint64]struct {
	role string
	sub  layout
}

// parse reads well-formed protobuf (an encoder's output) into a tree.
func parse(data []byte, role string, s layout) (*message, error) {
	m := &message{role: role}
	for i := 0; i < len(data); {
		tag, n := readVarint(data[i:])
		if n == 0 {
			return nil, fmt.Errorf("bad tag at %d", i)
		}
		i += n
		f := &field{num: tag >> 3, wt: tag & 7}
		switch f.wt {
		case wtVarint:
			v, n := readVarint(data[i:])
			if n == 0 {
				return nil, fmt.Errorf("bad varint at %d", i)
			}
			f.val, i = v, i+n
		case wtBytes:
			l, n := readVarint(data[i:])
			if n == 0 || i+n+int(l) > len(data) {
				return nil, fmt.Errorf("bad length at %d", i)
			}
			payload := data[i+n : i+n+int(l)]
			i += n + int(l)
			if sub, ok := s[f.num]; ok {
				nested, err := parse(payload, sub.role, sub.sub)
				if err != nil {
					return nil, err
				}
				f.msg = nested
			} else {
				f.raw = append([]byte{}, payload...)
			}
		case wtFixed64, wtFixed32:
			size := 8
			if f.wt == wtFixed32 {
				size = 4
			}
			if i+size > len(data) {
				return nil, fmt.Errorf("short fixed field at %d", i)
			}
			f.raw, i = append([]byte{}, data[i:i+size]...), i+size
		default:
			return nil, fmt.Errorf("wire type %d at %d", f.wt, i)
		}
		m.fields = append(m.fields, f)
	}
	return m, nil
}

func readVarint(data []byte) (uint64, int) {
	var v uint64
	for i := 0; i < len(data) && i < 10; i++ {
		v |= uint64(data[i]&0x7F) << (7 * i)
		if data[i] < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

func (m *message) clone() *message {
	c := &message{role: m.role}
	for _, f := range m.fields {
		g := *f
		if f.msg != nil {
			g.msg = f.msg.clone()
		}
		c.fields = append(c.fields, &g)
	}
	return c
}

// messages is every message of the tree, depth first.
func (m *message) messages() []*message {
	out := []*message{m}
	for _, f := range m.fields {
		if f.msg != nil {
			out = append(out, f.msg.messages()...)
		}
	}
	return out
}

func str(num uint64, s string) *field { return &field{num: num, wt: wtBytes, raw: []byte(s)} }

func sub(num uint64, m *message) *field { return &field{num: num, wt: wtBytes, msg: m} }
