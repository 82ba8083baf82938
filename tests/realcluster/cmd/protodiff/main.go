// Command protodiff decodes Kubernetes protobuf bodies with the kube-apiserver's own code, for
// the differential test of the gatekeeper's protobuf reader (tests/realcluster/test_protodiff.py).
//
//	protodiff generate -seed S [-from I] -count N
//	    N cases from seed S (case I is reproducible alone: its randomness is seeded by S and I):
//	    objects of the DRA kinds and DeleteOptions as client-go writes them, mutated with the
//	    known tricks (aliased tags, overlong varints, field numbers near 2**29 and 2**31,
//	    repeated fields, wire-type changes, truncation, bad lengths), and random envelopes.
//	protodiff decode
//	    one "TARGET<TAB>HEX" line in, one result out (the corpus, the pinned bodies).
//
// Each result is one JSON line: the target (group/version/Kind, or DeleteOptions), the body
// (hex, generate only), and what runtime.Unknown, the apiserver's codec, metav1.ObjectMeta and
// the delete handler's decoding saw: an error, or the values (hex of their bytes).
package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: protodiff generate -seed S [-from I] -count N | protodiff decode")
		os.Exit(2)
	}
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	defer out.Flush()
	enc := json.NewEncoder(out)
	switch os.Args[1] {
	case "generate":
		flags := flag.NewFlagSet("generate", flag.ExitOnError)
		seed := flags.Uint64("seed", 1, "the run's seed")
		from := flags.Int("from", 0, "the first case")
		count := flags.Int("count", 1000, "how many cases")
		_ = flags.Parse(os.Args[2:])
		for i := *from; i < *from+*count; i++ {
			target, body := generate(*seed, i)
			r := decode(i, target, body)
			r.Body = hex.EncodeToString(body)
			must(enc.Encode(r))
		}
	case "decode":
		in := bufio.NewScanner(os.Stdin)
		in.Buffer(make([]byte, 1<<20), 64<<20)
		for i := 0; in.Scan(); i++ {
			target, encoded, ok := bytes.Cut(in.Bytes(), []byte("\t"))
			body, err := hex.DecodeString(string(encoded))
			if !ok || err != nil {
				fmt.Fprintf(os.Stderr, "line %d: want TARGET<TAB>HEX\n", i+1)
				os.Exit(2)
			}
			must(enc.Encode(decode(i, string(target), body)))
		}
		must(in.Err())
	default:
		fmt.Fprintf(os.Stderr, "unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

// generate is case i of seed: a target and a body.
func generate(seed uint64, i int) (string, []byte) {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	target := deleteTarget
	if r.IntN(6) > 0 {
		target = pick(r, objectTargets...)
	}
	var tree *message
	switch {
	case r.IntN(10) == 0:
		tree = randomTree(r, target)
	case target == deleteTarget:
		tree = baseDelete(r)
	default:
		tree = baseObject(r, target)
	}
	for n := r.IntN(4); n > 0; n-- {
		mutate(r, tree)
	}
	body := append(append([]byte{}, magic...), tree.encode()...)
	if r.IntN(6) == 0 {
		body = mutateBytes(r, body)
	}
	return target, body
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
