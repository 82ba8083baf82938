package main

// The envelopes the mutations start from: objects of the DRA kinds as client-go writes them
// (the generated marshalers), DeleteOptions, and random trees.

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
)

var objectTargets = []string{
	"resource.k8s.io/v1/ResourceSlice",
	"resource.k8s.io/v1beta1/ResourceSlice",
	"resource.k8s.io/v1beta2/ResourceSlice",
	"resource.k8s.io/v1/ResourceClaim",
	"resource.k8s.io/v1beta1/ResourceClaim",
	"resource.k8s.io/v1beta2/ResourceClaim",
}

var (
	unknownLayout = layout{
		1: {role: "typeMeta"},
		2: {role: "object", sub: layout{1: {role: "metadata"}}},
	}
	deleteLayout = layout{
		1: {role: "typeMeta"},
		2: {role: "deleteOptions", sub: layout{2: {role: "preconditions"}}},
	}
)

type marshaler interface{ Marshal() ([]byte, error) }

func pick[T any](r *rand.Rand, items ...T) T { return items[r.IntN(len(items))] }

func randomString(r *rand.Rand) string {
	switch r.IntN(8) {
	case 0:
		return ""
	case 1:
		return pick(r, "node-a", "node-a/gpus", "gpu.example.com", "default", "kube-system")
	case 2:
		return fmt.Sprint(r.Uint64N(1 << 40))
	}
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789-."
	out := make([]byte, 1+r.IntN(24))
	for i := range out {
		out[i] = chars[r.IntN(len(chars))]
	}
	return string(out)
}

func randomMeta(r *rand.Rand, namespaced bool) map[string]any {
	m := map[string]any{}
	if r.IntN(8) > 0 {
		m["name"] = randomString(r)
	}
	if r.IntN(4) == 0 {
		m["generateName"] = randomString(r) + "-"
	}
	if namespaced && r.IntN(6) > 0 {
		m["namespace"] = pick(r, "default", "tenant", randomString(r))
	}
	if r.IntN(2) == 0 {
		m["resourceVersion"] = fmt.Sprint(r.Uint64N(1 << 32))
	}
	if r.IntN(3) == 0 {
		m["uid"] = fmt.Sprintf("%08x-0000-4000-8000-%012x", r.Uint32(), r.Uint64N(1<<48))
	}
	if r.IntN(3) == 0 {
		m["labels"] = map[string]string{"app": randomString(r), "tier": randomString(r)}
	}
	if r.IntN(4) == 0 {
		m["annotations"] = map[string]string{"example.com/note": randomString(r)}
	}
	if r.IntN(5) == 0 {
		m["finalizers"] = []string{"example.com/" + randomString(r)}
	}
	return m
}

func sliceSpec(r *rand.Rand, version string) map[string]any {
	device := map[string]any{"name": "dev-" + fmt.Sprint(r.IntN(8))}
	if version == "v1beta1" {
		device["basic"] = map[string]any{}
	}
	return map[string]any{
		"driver":   pick(r, "gpu.example.com", "nic.example.com", randomString(r)),
		"nodeName": pick(r, "node-a", "node-b"),
		"pool":     map[string]any{"name": pick(r, "node-a", "node-a/x", "node-b"), "generation": r.IntN(5), "resourceSliceCount": 1},
		"devices":  []any{device},
	}
}

func claimStatus(r *rand.Rand) map[string]any {
	return map[string]any{"devices": []any{map[string]any{
		"driver": pick(r, "gpu.example.com", "nic.example.com"), "pool": "node-a", "device": "gpu-" + fmt.Sprint(r.IntN(4)),
	}}}
}

// baseObject is an object of target as client-go's generated marshaler writes it.
func baseObject(r *rand.Rand, target string) *message {
	gv, kind := splitTarget(target)
	object := map[string]any{"metadata": randomMeta(r, kind == "ResourceClaim")}
	if kind == "ResourceSlice" {
		object["spec"] = sliceSpec(r, gv.Version)
	} else if r.IntN(2) == 0 {
		object["status"] = claimStatus(r)
	}
	typed, err := legacyscheme.Scheme.New(gv.WithKind(kind))
	if err != nil {
		panic(err)
	}
	encoded, _ := json.Marshal(object)
	if err := json.Unmarshal(encoded, typed); err != nil {
		panic(err)
	}
	apiVersion := gv.String()
	if r.IntN(40) == 0 {
		apiVersion = pick(r, "", "resource.k8s.io/v1", "resource.k8s.io/v1beta2", "v1")
	}
	return envelope(r, apiVersion, pick(r, kind, kind, kind, kind, "", "ResourceClaim"), typed.(marshaler), unknownLayout)
}

func baseDelete(r *rand.Rand) *message {
	options := &metav1.DeleteOptions{}
	if r.IntN(2) == 0 {
		grace := pick(r, int64(0), int64(30), int64(-1), r.Int64(), -r.Int64())
		options.GracePeriodSeconds = &grace
	}
	if r.IntN(2) == 0 {
		options.Preconditions = &metav1.Preconditions{}
		if r.IntN(3) > 0 {
			uid := types.UID(randomString(r))
			options.Preconditions.UID = &uid
		}
		if r.IntN(3) > 0 {
			rv := randomString(r)
			options.Preconditions.ResourceVersion = &rv
		}
	}
	if r.IntN(3) == 0 {
		orphan := r.IntN(2) == 0
		options.OrphanDependents = &orphan
	}
	if r.IntN(2) == 0 {
		policy := metav1.DeletionPropagation(pick(r, "Orphan", "Background", "Foreground", "", randomString(r)))
		options.PropagationPolicy = &policy
	}
	for i := r.IntN(3); i > 0; i-- {
		options.DryRun = append(options.DryRun, pick(r, "All", "", randomString(r)))
	}
	if r.IntN(5) == 0 {
		ignore := r.IntN(2) == 0
		options.IgnoreStoreReadErrorWithClusterBreakingPotential = &ignore
	}
	apiVersion := pick(r, "meta.k8s.io/v1", "resource.k8s.io/v1", "v1", "", "meta.k8s.io/v1beta1", "apps/v1")
	return envelope(r, apiVersion, pick(r, "DeleteOptions", "DeleteOptions", "", "Status"), options, deleteLayout)
}

// envelope is runtime.Unknown{typeMeta, raw = object} as the protobuf serializer writes it.
func envelope(r *rand.Rand, apiVersion, kind string, object marshaler, s layout) *message {
	raw, err := object.Marshal()
	if err != nil {
		panic(err)
	}
	unk := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: apiVersion, Kind: kind}, Raw: raw}
	data, err := unk.Marshal()
	if err != nil {
		panic(err)
	}
	m, err := parse(data, "envelope", s)
	if err != nil {
		panic(err)
	}
	return m
}

// randomTree is an envelope built of random fields: the numbers the readers care about
// (plainly, aliased, repeated) and others, with random payloads.
func randomTree(r *rand.Rand, target string) *message {
	typeMeta := &message{role: "typeMeta"}
	for i := r.IntN(4); i > 0; i-- {
		gv, kind := splitTarget(pick(r, objectTargets...))
		typeMeta.fields = append(typeMeta.fields, str(pick(r, uint64(1), 2, 3), pick(r, gv.String(), kind, randomString(r))))
	}
	metadata := &message{role: "metadata"}
	for i := r.IntN(6); i > 0; i-- {
		metadata.fields = append(metadata.fields, randomField(r, pick(r, uint64(1), 2, 3, 6, 6, 11, 12, 14)))
	}
	object := &message{role: "object", fields: []*field{sub(1, metadata)}}
	for i := r.IntN(3); i > 0; i-- {
		object.fields = append(object.fields, randomField(r, pick(r, uint64(1), 2, 3, 4)))
	}
	if target == deleteTarget {
		object = &message{role: "deleteOptions"}
		for i := r.IntN(6); i > 0; i-- {
			object.fields = append(object.fields, randomField(r, 1+r.Uint64N(7)))
		}
	}
	envelope := &message{role: "envelope", fields: []*field{sub(1, typeMeta), sub(2, object)}}
	for i := r.IntN(3); i > 0; i-- {
		envelope.fields = append(envelope.fields, randomField(r, 1+r.Uint64N(6)))
	}
	r.Shuffle(len(envelope.fields), func(i, j int) {
		envelope.fields[i], envelope.fields[j] = envelope.fields[j], envelope.fields[i]
	})
	for range r.IntN(3) {
		mutate(r, envelope)
	}
	return envelope
}

func randomField(r *rand.Rand, num uint64) *field {
	switch r.IntN(6) {
	case 0:
		return &field{num: num, wt: wtVarint, val: pick(r, 0, 1, 2, r.Uint64())}
	case 1:
		if r.IntN(2) == 0 {
			return &field{num: num, wt: wtFixed32, raw: randomBytes(r, 4)}
		}
		return &field{num: num, wt: wtFixed64, raw: randomBytes(r, 8)}
	case 2:
		return sub(num, &message{role: "nested", fields: []*field{str(1, randomString(r))}})
	}
	return str(num, randomString(r))
}

func randomBytes(r *rand.Rand, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = byte(r.Uint32())
	}
	return out
}
