// Command etcd is the upstream etcd server main (etcd 3.6: the progress requests a
// 1.36 watch without resourceVersion needs).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
