package main

// What the kube-apiserver reads of a body, with its own code: runtime.Unknown's generated
// unmarshaler, metav1.ObjectMeta's (through PartialObjectMetadata, whose field 1 it is), the
// protobuf serializer of legacyscheme.Codecs decoding to the internal version as the create and
// update handlers do, and the meta internal codecs decoding DeleteOptions as the delete handler
// does.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	_ "k8s.io/kubernetes/pkg/apis/resource/install"
)

var magic = []byte("k8s\x00")

// view is what one decoder saw: an error, or the values (hex of the exact bytes).
type view struct {
	Err             string `json:"err,omitempty"`
	APIVersion      string `json:"apiVersion,omitempty"`
	Kind            string `json:"kind,omitempty"`
	Name            string `json:"name,omitempty"`
	Namespace       string `json:"namespace,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	// Rest is a digest of the whole decoded object with its resourceVersion cleared: the pin
	// must change nothing else.
	Rest string `json:"rest,omitempty"`
	// Options is the decoded DeleteOptions (JSON).
	Options json.RawMessage `json:"options,omitempty"`
}

type result struct {
	Index  int    `json:"i"`
	Target string `json:"t"`
	Body   string `json:"b,omitempty"`
	// Unknown: runtime.Unknown's apiVersion and kind.
	Unknown view `json:"u"`
	// Codec: the apiserver's decoding (apiVersion, kind, name, namespace, resourceVersion).
	Codec *view `json:"c,omitempty"`
	// Meta: metav1.ObjectMeta of the raw object (name, namespace, resourceVersion).
	Meta *view `json:"m,omitempty"`
	// Delete: the delete handler's DeleteOptions.
	Delete *view `json:"d,omitempty"`
}

const deleteTarget = "DeleteOptions"

func hexs(s string) string { return hex.EncodeToString([]byte(s)) }

func failed(err error) view { return view{Err: err.Error()} }

var (
	objectSerializer = protobufSerializer(legacyscheme.Codecs)
	metaCodecs       = metainternalversionscheme.Codecs
	deleteSerializer = protobufSerializer(metaCodecs)
)

func protobufSerializer(codecs runtime.NegotiatedSerializer) runtime.Serializer {
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		panic("no protobuf serializer")
	}
	return info.Serializer
}

func decode(index int, target string, body []byte) result {
	r := result{Index: index, Target: target}
	var unk runtime.Unknown
	if !bytes.HasPrefix(body, magic) {
		r.Unknown = view{Err: "no prefix"}
	} else if err := unk.Unmarshal(body[len(magic):]); err != nil {
		r.Unknown = failed(err)
	} else {
		r.Unknown = view{APIVersion: hexs(unk.APIVersion), Kind: hexs(unk.Kind)}
	}
	if target == deleteTarget {
		d := decodeDelete(body)
		r.Delete = &d
		return r
	}
	c := decodeObject(target, body)
	r.Codec = &c
	if r.Unknown.Err == "" {
		m := decodeMeta(unk.Raw)
		r.Meta = &m
	}
	return r
}

// decodeObject decodes as the update handler does: DecoderToVersion(protobuf, internal) with
// the URL's kind as default, then the check that the body's group version is the URL's.
func decodeObject(target string, body []byte) view {
	gv, kind := splitTarget(target)
	gvk := gv.WithKind(kind)
	internal := schema.GroupVersion{Group: gv.Group, Version: runtime.APIVersionInternal}
	original, err := legacyscheme.Scheme.New(internal.WithKind(kind))
	if err != nil {
		panic(err)
	}
	decoder := legacyscheme.Codecs.DecoderToVersion(objectSerializer, internal)
	obj, got, err := decoder.Decode(body, &gvk, original)
	if err != nil {
		return failed(err)
	}
	if got.GroupVersion() != gv {
		return view{Err: fmt.Sprintf("the API version in the data (%s) does not match the expected API version (%s)", got.GroupVersion(), gv)}
	}
	accessor, err := meta.Accessor(obj)
	if err != nil {
		return failed(err)
	}
	v := view{
		APIVersion:      hexs(got.GroupVersion().String()),
		Kind:            hexs(got.Kind),
		Name:            hexs(accessor.GetName()),
		Namespace:       hexs(accessor.GetNamespace()),
		ResourceVersion: hexs(accessor.GetResourceVersion()),
	}
	accessor.SetResourceVersion("")
	encoded, err := json.Marshal(obj)
	if err != nil {
		return failed(err)
	}
	digest := sha256.Sum256(encoded)
	v.Rest = hex.EncodeToString(digest[:8])
	return v
}

func decodeMeta(raw []byte) view {
	var object metav1.PartialObjectMetadata
	if err := object.Unmarshal(raw); err != nil {
		return failed(err)
	}
	return view{
		Name:            hexs(object.Name),
		Namespace:       hexs(object.Namespace),
		ResourceVersion: hexs(object.ResourceVersion),
	}
}

// decodeDelete decodes as the delete handler does (scope.MetaGroupVersion is meta.k8s.io/v1).
func decodeDelete(body []byte) view {
	defaultGVK := metav1.SchemeGroupVersion.WithKind("DeleteOptions")
	options := &metav1.DeleteOptions{}
	obj, _, err := metaCodecs.DecoderToVersion(deleteSerializer, defaultGVK.GroupVersion()).Decode(body, &defaultGVK, options)
	if err != nil {
		return failed(err)
	}
	if obj != options {
		return view{Err: "decoded object cannot be converted to DeleteOptions"}
	}
	options.TypeMeta = metav1.TypeMeta{}
	encoded, err := json.Marshal(options)
	if err != nil {
		return failed(err)
	}
	return view{Options: encoded}
}

func splitTarget(target string) (schema.GroupVersion, string) {
	for i := len(target) - 1; i >= 0; i-- {
		if target[i] == '/' {
			gv, err := schema.ParseGroupVersion(target[:i])
			if err != nil {
				panic(err)
			}
			return gv, target[i+1:]
		}
	}
	panic("bad target " + target)
}
