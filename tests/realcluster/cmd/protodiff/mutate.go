package main

// Mutations: the known tricks against a protobuf reader that is not Go's. Each picks a message
// of the tree (or the final bytes) and changes one thing.

import (
	"math/rand/v2"
	"slices"
)

// nearLimits are field numbers around the protobuf maximum (2**29-1) and int32's range.
var nearLimits = []uint64{
	0, 7, 100, 1<<29 - 1, 1 << 29, 1<<29 + 1, 1<<31 - 1, 1 << 31, 1<<31 + 1, 1<<32 - 1, 1 << 32,
	1<<32 + 1, 1<<32 + 6, 1<<35 + 1,
}

// interesting are the fields of each role the readers take values from, with what a hidden
// copy of them could say.
var interesting = map[string][]func(r *rand.Rand) *field{
	"envelope": {
		func(r *rand.Rand) *field {
			gv, kind := splitTarget(pick(r, objectTargets...))
			return sub(1, &message{role: "typeMeta", fields: []*field{str(1, gv.String()), str(2, kind)}})
		},
		func(r *rand.Rand) *field {
			return sub(2, &message{role: "object", fields: []*field{sub(1, hiddenMeta(r))}})
		},
		func(r *rand.Rand) *field { return str(3, pick(r, "", "gzip")) },
		func(r *rand.Rand) *field { return str(4, pick(r, "", "application/json")) },
	},
	"typeMeta": {
		func(r *rand.Rand) *field {
			return str(1, pick(r, "resource.k8s.io/v1", "resource.k8s.io/v1beta1", "v1"))
		},
		func(r *rand.Rand) *field { return str(2, pick(r, "ResourceSlice", "ResourceClaim", "DeleteOptions")) },
	},
	"object":   {func(r *rand.Rand) *field { return sub(1, hiddenMeta(r)) }},
	"metadata": {func(r *rand.Rand) *field { return hiddenMeta(r).fields[0] }},
	"deleteOptions": {
		func(r *rand.Rand) *field {
			return sub(2, &message{role: "preconditions", fields: []*field{str(pick(r, uint64(1), 2), randomString(r))}})
		},
		func(r *rand.Rand) *field { return &field{num: 1, wt: wtVarint, val: pick(r, 0, 1, 1<<63, r.Uint64())} },
		func(r *rand.Rand) *field {
			return &field{num: pick(r, uint64(3), 6), wt: wtVarint, val: pick(r, uint64(0), 1, 2)}
		},
		func(r *rand.Rand) *field { return str(pick(r, uint64(4), 5), pick(r, "Orphan", "All", "")) },
	},
	"preconditions": {func(r *rand.Rand) *field { return str(pick(r, uint64(1), 2), pick(r, "", "1", randomString(r))) }},
}

func hiddenMeta(r *rand.Rand) *message {
	m := &message{role: "metadata"}
	switch r.IntN(4) {
	case 0:
		m.fields = append(m.fields, str(1, pick(r, "other", "")))
	case 1:
		m.fields = append(m.fields, str(3, pick(r, "kube-system", "")))
	default:
		m.fields = append(m.fields, str(6, pick(r, "", "1")))
	}
	return m
}

func aliasedTag(r *rand.Rand, num, wt uint64) []byte {
	tag := num<<3 | wt
	switch r.IntN(6) {
	case 0:
		return wide(tag, byte(1+r.IntN(63))) // bits past 64
	case 1:
		return varint((num+(1<<29))<<3 | wt) // past the maximum, not an alias
	case 2:
		return overlong(r, tag) // overlong: the same value, or past 10 bytes (Go's overflow)
	}
	k := pick(r, uint64(1), 2, 3, 8, 1<<r.IntN(29))
	return varint((num+k<<32)<<3 | wt)
}

func insert(r *rand.Rand, m *message, f *field) {
	at := len(m.fields)
	if r.IntN(3) == 0 {
		at = r.IntN(len(m.fields) + 1)
	}
	m.fields = slices.Insert(m.fields, at, f)
}

func randomFieldOf(r *rand.Rand, m *message) *field {
	if len(m.fields) == 0 {
		return nil
	}
	return m.fields[r.IntN(len(m.fields))]
}

// mutate changes one thing in one message of the tree.
func mutate(r *rand.Rand, tree *message) {
	all := tree.messages()
	m := all[r.IntN(len(all))]
	f := randomFieldOf(r, m)
	switch op := r.IntN(12); {
	case op <= 2: // a hidden copy of a field the readers take a value from
		if makers := interesting[m.role]; len(makers) > 0 {
			g := pick(r, makers...)(r)
			if r.IntN(4) > 0 {
				g.tag = aliasedTag(r, g.num, g.wt)
			}
			insert(r, m, g)
		}
	case op == 3 && f != nil:
		f.tag = aliasedTag(r, f.num, f.wt)
	case op == 4:
		insert(r, m, limitField(r))
	case op == 5 && f != nil: // repeated
		g := *f
		if f.msg != nil {
			g.msg = f.msg.clone()
		} else if f.wt == wtBytes && r.IntN(2) == 0 {
			g.raw = []byte(randomString(r))
		}
		insert(r, m, &g)
	case op == 6 && f != nil:
		changeWireType(r, f)
	case op == 7 && f != nil:
		m.fields = slices.DeleteFunc(m.fields, func(g *field) bool { return g == f })
	case op == 8 && len(m.fields) > 1:
		r.Shuffle(len(m.fields), func(i, j int) { m.fields[i], m.fields[j] = m.fields[j], m.fields[i] })
	case op == 9 && f != nil && f.wt == wtBytes:
		f.length = badLength(r, len(f.payload()))
	case op == 10 && f != nil && f.wt == wtVarint:
		f.raw = pick(r, wide(f.val, byte(1+r.IntN(63))), padded(f.val, 2+r.IntN(10)), varint(pick(r, 2, 1<<63, 1<<64-1, 1<<32+f.val)))
	case op == 11 && f != nil && f.wt == wtBytes && f.msg == nil:
		f.raw = pick(r, []byte{}, []byte(randomString(r)), randomBytes(r, 1+r.IntN(6)), []byte("\xff\xfe"), []byte("caf\xc3"))
	}
}

// limitField is a field numbered near a limit, of any wire type (groups included).
func limitField(r *rand.Rand) *field {
	num := pick(r, nearLimits...)
	switch wt := uint64(r.IntN(8)); wt {
	case wtVarint:
		return &field{num: num, wt: wt, val: r.Uint64N(300)}
	case wtBytes:
		return str(num, randomString(r))
	case wtFixed32:
		return &field{num: num, wt: wt, raw: randomBytes(r, 4)}
	case wtFixed64:
		return &field{num: num, wt: wt, raw: randomBytes(r, 8)}
	case wtGroupStart: // a group: inner fields, then its end
		inner := (&message{fields: []*field{str(6, ""), str(1, "x")}}).encode()
		end := varint(pick(r, num, 6, 1)<<3 | wtGroupEnd)
		return &field{num: num, wt: wt, raw: append(inner[:r.IntN(len(inner)+1)], end...)}
	default:
		return &field{num: num, wt: wt, raw: randomBytes(r, r.IntN(4))}
	}
}

// changeWireType keeps the field's bytes after the tag and changes only its wire type.
func changeWireType(r *rand.Rand, f *field) {
	var after []byte
	switch f.wt {
	case wtVarint:
		after = f.raw
		if after == nil {
			after = varint(f.val)
		}
	case wtBytes:
		p := f.payload()
		after = append(varint(uint64(len(p))), p...)
	default:
		after = f.raw
	}
	f.msg, f.length, f.tag = nil, nil, nil
	f.wt = (f.wt + 1 + uint64(r.IntN(7))) % 8
	if f.wt == wtBytes {
		// A length-delimited field now: what followed the tag is its payload.
		f.raw = after
	} else {
		f.raw = append([]byte{}, after...)
	}
}

// overlong is v's varint padded to 1 to 11 bytes more than it needs, at most 11 in all.
func overlong(r *rand.Rand, v uint64) []byte {
	n := len(varint(v))
	return padded(v, n+1+r.IntN(max(1, 11-n)))
}

// badLength is a length varint that is not the payload's.
func badLength(r *rand.Rand, n int) []byte {
	l := uint64(n)
	switch r.IntN(8) {
	case 0:
		return varint(l + 1 + r.Uint64N(4))
	case 1:
		return varint(l - min(l, 1+r.Uint64N(4)))
	case 2:
		return varint(pick(r, uint64(1)<<31, 1<<31-1, 1<<32+l, 1<<63, 1<<64-1, 1<<63+l))
	case 3:
		return wide(l, byte(1+r.IntN(63))) // Go reads l; bits past 64 dropped
	case 4:
		return overlong(r, l)
	default:
		return varint(l ^ uint64(1)<<r.IntN(12))
	}
}

// mutateBytes changes the encoded body: truncation, a flipped, inserted or deleted byte.
func mutateBytes(r *rand.Rand, body []byte) []byte {
	if len(body) <= len(magic) {
		return body
	}
	at := len(magic) + r.IntN(len(body)-len(magic))
	out := append([]byte{}, body...)
	switch r.IntN(4) {
	case 0:
		return out[:at]
	case 1:
		out[at] ^= 1 << r.IntN(8)
	case 2:
		out = slices.Insert(out, at, byte(r.Uint32()))
	default:
		out = slices.Delete(out, at, at+1)
	}
	return out
}
