// Command dradriver is a DRA driver built the way real ones are: client-go with its defaults
// and the upstream k8s.io/dynamic-resource-allocation helper (kubeletplugin, its ResourceSlice
// controller, draclient). The test suite drives it through the gatekeeper and checks what the
// real kube-apiserver stored.
//
// It reads one JSON command per line on stdin and answers one JSON line per command on stdout;
// background events (informer events, the helper's errors) are JSON lines too. Nothing here
// knows about the gatekeeper: the connection comes from --connect, exactly as a driver's would.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// out serializes every line written to stdout.
type out struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (o *out) emit(v map[string]any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_ = o.enc.Encode(v)
}

func main() {
	connect := flag.String("connect", "incluster", "how to reach the API: incluster, kubeconfig=FILE, socket=PATH")
	contentType := flag.String("content-type", "", "rest.Config.ContentType (empty: client-go's default)")
	driver := flag.String("driver", "gpu.example.com", "the DRA driver name")
	node := flag.String("node", "node-a", "the node this driver runs on")
	pluginDir := flag.String("plugin-dir", "", "directory for the kubelet plugin's gRPC sockets")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := &out{enc: json.NewEncoder(os.Stdout)}

	config, err := restConfig(*connect)
	if err != nil {
		o.emit(map[string]any{"event": "fatal", "error": err.Error()})
		os.Exit(2)
	}
	if *contentType != "" {
		config.ContentType = *contentType
	}
	config.UserAgent = "dradriver/" + *driver
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		o.emit(map[string]any{"event": "fatal", "error": err.Error()})
		os.Exit(2)
	}
	dynamicClient, err := dynamic.NewForConfig(config)
	if err != nil {
		o.emit(map[string]any{"event": "fatal", "error": err.Error()})
		os.Exit(2)
	}
	d := &driverState{
		ctx: ctx, out: o, client: client, dynamic: dynamicClient,
		driver: *driver, node: *node, pluginDir: *pluginDir,
	}
	defer d.shutdown()
	o.emit(map[string]any{"event": "ready", "host": config.Host, "contentType": config.ContentType})

	lines := make(chan string)
	go func() {
		scanner := bufio.NewScanner(os.Stdin)
		scanner.Buffer(make([]byte, 1024*1024), 16*1024*1024)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
		close(lines)
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case line, ok := <-lines:
			if !ok {
				return
			}
			if strings.TrimSpace(line) == "" {
				continue
			}
			var cmd command
			if err := json.Unmarshal([]byte(line), &cmd); err != nil {
				o.emit(map[string]any{"op": "?", "error": "bad command: " + err.Error()})
				continue
			}
			if cmd.Op == "exit" {
				o.emit(map[string]any{"op": "exit", "ok": true})
				return
			}
			o.emit(d.run(cmd))
		}
	}
}

// restConfig builds the client configuration the way a driver would for each connection mode.
func restConfig(connect string) (*rest.Config, error) {
	mode, arg, _ := strings.Cut(connect, "=")
	switch mode {
	case "incluster":
		// Unchanged in-cluster config: KUBERNETES_SERVICE_HOST/PORT and the service-account
		// volume's token and ca.crt.
		return rest.InClusterConfig()
	case "kubeconfig":
		return clientcmd.BuildConfigFromFlags("", arg)
	case "socket":
		config := &rest.Config{Host: "http://localhost"}
		config.Dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dialer net.Dialer
			return dialer.DialContext(ctx, "unix", arg)
		}
		return config, nil
	}
	return nil, fmt.Errorf("unknown --connect mode %q", mode)
}
