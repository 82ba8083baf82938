// Command kubeletdra is the kubelet's half of a DRA kubelet plugin's gRPC API, called as the
// kubelet calls it: it finds the plugin's registration socket in the plugin registry directory,
// asks it for its PluginInfo (GetInfo: type, driver name, DRA endpoint, API versions), reports
// the registration back (NotifyRegistrationStatus), and then, as a pod with a claim starts or
// stops, calls NodePrepareResources or NodeUnprepareResources of k8s.io/kubelet/pkg/apis/dra/v1
// on the endpoint. "health" is the kubelet's gRPC liveness probe of the plugin's health port.
//
// One call per run; it prints one JSON document, what the plugin answered, and exits 0, or 1
// with {"error": ...} when the plugin could not be reached or refused the call itself.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// claims collects the repeated -claim NAMESPACE/NAME/UID flags.
type claims []*drapb.Claim

func (c *claims) String() string { return fmt.Sprint(len(*c)) }

func (c *claims) Set(value string) error {
	parts := strings.Split(value, "/")
	if len(parts) != 3 || slices.Contains(parts, "") {
		return fmt.Errorf("claim %q is not NAMESPACE/NAME/UID", value)
	}
	*c = append(*c, &drapb.Claim{Namespace: parts[0], Name: parts[1], Uid: parts[2]})
	return nil
}

func main() {
	op := flag.String("op", "", "prepare, unprepare, register or health")
	registry := flag.String("registry", "", "the kubelet's plugin registry directory")
	driver := flag.String("driver", "", "the DRA driver whose plugin is called")
	port := flag.Int("health-port", 0, "the plugin's gRPC health port (op health)")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline of the whole call")
	var requested claims
	flag.Var(&requested, "claim", "NAMESPACE/NAME/UID of a claim (repeatable)")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	answer, err := run(ctx, *op, *registry, *driver, *port, requested)
	if err != nil {
		answer = map[string]any{"error": err.Error()}
	}
	_ = json.NewEncoder(os.Stdout).Encode(answer)
	if err != nil {
		os.Exit(1)
	}
}

func run(ctx context.Context, op, registry, driver string, port int, requested claims) (map[string]any, error) {
	if op == "health" {
		return health(ctx, port)
	}
	info, err := register(ctx, registry, driver)
	if err != nil {
		return nil, err
	}
	registration := map[string]any{
		"type": info.Type, "name": info.Name, "endpoint": info.Endpoint,
		"supportedVersions": info.SupportedVersions,
	}
	if op == "register" {
		return map[string]any{"registration": registration}, nil
	}
	if !slices.Contains(info.SupportedVersions, drapb.DRAPluginService) {
		return nil, fmt.Errorf("plugin %s does not serve %s: %v", driver, drapb.DRAPluginService, info.SupportedVersions)
	}
	conn, err := dial(info.Endpoint)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	plugin := drapb.NewDRAPluginClient(conn)
	result := map[string]any{}
	switch op {
	case "prepare":
		response, err := plugin.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: requested})
		if err != nil {
			return nil, fmt.Errorf("NodePrepareResources: %w", err)
		}
		for uid, claim := range response.GetClaims() {
			devices := []map[string]any{}
			for _, device := range claim.GetDevices() {
				devices = append(devices, map[string]any{
					"requestNames": device.GetRequestNames(), "pool": device.GetPoolName(),
					"device": device.GetDeviceName(), "cdiDeviceIDs": device.GetCdiDeviceIds(),
				})
			}
			result[uid] = map[string]any{"devices": devices, "error": claim.GetError()}
		}
	case "unprepare":
		response, err := plugin.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: requested})
		if err != nil {
			return nil, fmt.Errorf("NodeUnprepareResources: %w", err)
		}
		for uid, claim := range response.GetClaims() {
			result[uid] = map[string]any{"error": claim.GetError()}
		}
	default:
		return nil, fmt.Errorf("unknown -op %q (prepare, unprepare, register, health)", op)
	}
	return map[string]any{"registration": registration, "claims": result}, nil
}

// register does what the kubelet's plugin watcher does with each socket in its registry
// directory: GetInfo, then NotifyRegistrationStatus. It returns the info of driver's plugin.
func register(ctx context.Context, registry, driver string) (*registerapi.PluginInfo, error) {
	sockets, err := filepath.Glob(filepath.Join(registry, "*.sock"))
	if err != nil {
		return nil, err
	}
	var found []*registerapi.PluginInfo
	var failures []error
	for _, socket := range sockets {
		info, err := registerOne(ctx, socket, driver)
		if err != nil {
			failures = append(failures, fmt.Errorf("%s: %w", filepath.Base(socket), err))
		} else if info != nil {
			found = append(found, info)
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%d registration sockets of %s in %s (of %d): %w",
			len(found), driver, registry, len(sockets), errors.Join(failures...))
	}
	return found[0], nil
}

func registerOne(ctx context.Context, socket, driver string) (*registerapi.PluginInfo, error) {
	conn, err := dial(socket)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	registration := registerapi.NewRegistrationClient(conn)
	info, err := registration.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetInfo: %w", err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != driver {
		return nil, nil
	}
	status := &registerapi.RegistrationStatus{PluginRegistered: true}
	if _, err := registration.NotifyRegistrationStatus(ctx, status); err != nil {
		return nil, fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	return info, nil
}

// dial connects to a Unix socket path as the kubelet does (no transport security: the
// socket's directory is the boundary).
func dial(path string) (*grpc.ClientConn, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("endpoint %q is not an absolute socket path", path)
	}
	return grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// health is the kubelet's gRPC liveness probe: service "liveness" on the plugin's port.
func health(ctx context.Context, port int) (map[string]any, error) {
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", port), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	response, err := grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: "liveness"})
	if err != nil {
		return nil, fmt.Errorf("health Check: %w", err)
	}
	return map[string]any{"status": response.GetStatus().String()}, nil
}
