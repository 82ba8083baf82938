package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	draclient "k8s.io/dynamic-resource-allocation/client"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// command is one line of stdin. Only the fields an op needs are set.
type command struct {
	Op         string                                                  `json:"op"`
	Pools      map[string][]resourceapi.Device                         `json:"pools,omitempty"`
	Claims     []claimRef                                              `json:"claims,omitempty"`
	Namespace  string                                                  `json:"namespace,omitempty"`
	Name       string                                                  `json:"name,omitempty"`
	Devices    []resourceapi.AllocatedDeviceStatus                     `json:"devices,omitempty"`
	Apply      []resourceapply.AllocatedDeviceStatusApplyConfiguration `json:"apply,omitempty"`
	Object     json.RawMessage                                         `json:"object,omitempty"`
	Kinds      []string                                                `json:"kinds,omitempty"`
	DryRun     bool                                                    `json:"dryRun,omitempty"`
	Propagate  string                                                  `json:"propagationPolicy,omitempty"`
	Grace      *int64                                                  `json:"gracePeriodSeconds,omitempty"`
	PreUID     string                                                  `json:"preconditionUID,omitempty"`
	PreRV      string                                                  `json:"preconditionResourceVersion,omitempty"`
	Force      bool                                                    `json:"force,omitempty"`
	AllDevices bool                                                    `json:"allDevices,omitempty"`
	// Unconditional leaves metadata.resourceVersion empty in an update: the apiserver then
	// writes whatever version is stored (a protobuf PUT without resourceVersion).
	Unconditional bool `json:"unconditional,omitempty"`

	// The calls of extra.go.
	Labels        map[string]*string `json:"labels,omitempty"`
	UID           string             `json:"uid,omitempty"`
	Reason        string             `json:"reason,omitempty"`
	Component     string             `json:"component,omitempty"`
	Message       string             `json:"message,omitempty"`
	Resource      string             `json:"resource,omitempty"`
	Status        json.RawMessage    `json:"status,omitempty"`
	FieldSelector string             `json:"fieldSelector,omitempty"`
}

type claimRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

type driverState struct {
	ctx       context.Context
	out       *out
	client    kubernetes.Interface
	dynamic   dynamic.Interface
	driver    string
	node      string
	pluginDir string

	mu        sync.Mutex
	helper    *kubeletplugin.Helper
	informers []context.CancelFunc
}

func (d *driverState) shutdown() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, cancel := range d.informers {
		cancel()
	}
	if d.helper != nil {
		d.helper.Stop()
	}
}

// run executes one command and returns its answer line.
func (d *driverState) run(cmd command) map[string]any {
	ctx, cancel := context.WithTimeout(d.ctx, 60*time.Second)
	defer cancel()
	result, err := d.dispatch(ctx, cmd)
	answer := map[string]any{"op": cmd.Op, "ok": err == nil}
	if err != nil {
		answer["error"] = err.Error()
		var status apierrors.APIStatus
		if errors.As(err, &status) {
			s := status.Status()
			answer["code"] = s.Code
			answer["reason"] = string(s.Reason)
			answer["message"] = s.Message
		}
	}
	for k, v := range result {
		answer[k] = v
	}
	return answer
}

func (d *driverState) dispatch(ctx context.Context, cmd command) (map[string]any, error) {
	slices := d.client.ResourceV1().ResourceSlices()
	switch cmd.Op {
	case "publish":
		return nil, d.publish(ctx, cmd.Pools)
	case "prepare":
		return d.prepare(ctx, cmd.Claims)
	case "get-claim":
		// draclient: the helper's own client, which walks API versions on a 404.
		claim, err := draclient.New(d.client).ResourceClaims(cmd.Namespace).Get(ctx, cmd.Name, metav1.GetOptions{})
		return objectResult(claim, err)
	case "update-status":
		return d.updateStatus(ctx, cmd)
	case "apply-status":
		claim := resourceapply.ResourceClaim(cmd.Name, cmd.Namespace)
		status := resourceapply.ResourceClaimStatus()
		for i := range cmd.Apply {
			status = status.WithDevices(&cmd.Apply[i])
		}
		claim = claim.WithStatus(status)
		applied, err := d.client.ResourceV1().ResourceClaims(cmd.Namespace).ApplyStatus(
			ctx, claim, metav1.ApplyOptions{FieldManager: d.driver, Force: cmd.Force})
		return objectResult(applied, err)
	case "watch":
		return nil, d.watch(cmd.Kinds)
	case "list-slices":
		list, err := slices.List(ctx, metav1.ListOptions{FieldSelector: d.sliceSelector()})
		if err != nil {
			return nil, err
		}
		names := []string{}
		for _, item := range list.Items {
			names = append(names, item.Name)
		}
		return map[string]any{"names": names, "resourceVersion": list.ResourceVersion}, nil
	case "get-slice":
		slice, err := slices.Get(ctx, cmd.Name, metav1.GetOptions{})
		return objectResult(slice, err)
	case "create-slice", "update-slice":
		var slice resourceapi.ResourceSlice
		if err := json.Unmarshal(cmd.Object, &slice); err != nil {
			return nil, fmt.Errorf("object: %w", err)
		}
		options := metav1.CreateOptions{}
		if cmd.DryRun {
			options.DryRun = []string{metav1.DryRunAll}
		}
		if cmd.Op == "create-slice" {
			created, err := slices.Create(ctx, &slice, options)
			return objectResult(created, err)
		}
		updated, err := slices.Update(ctx, &slice, metav1.UpdateOptions{DryRun: options.DryRun})
		return objectResult(updated, err)
	case "delete-slice":
		return nil, slices.Delete(ctx, cmd.Name, d.deleteOptions(cmd))
	case "get-node":
		node, err := d.client.CoreV1().Nodes().Get(ctx, d.node, metav1.GetOptions{})
		return objectResult(node, err)
	}
	if result, handled, err := d.dispatchExtra(ctx, cmd); handled {
		return result, err
	}
	return nil, fmt.Errorf("unknown op %q", cmd.Op)
}

func (d *driverState) sliceSelector() string {
	// The same selector the helper's ResourceSlice controller uses for its own slices.
	return fields.Set{
		resourceapi.ResourceSliceSelectorDriver:   d.driver,
		resourceapi.ResourceSliceSelectorNodeName: d.node,
	}.AsSelector().String()
}

func (d *driverState) deleteOptions(cmd command) metav1.DeleteOptions {
	options := metav1.DeleteOptions{GracePeriodSeconds: cmd.Grace}
	if cmd.DryRun {
		options.DryRun = []string{metav1.DryRunAll}
	}
	if cmd.Propagate != "" {
		policy := metav1.DeletionPropagation(cmd.Propagate)
		options.PropagationPolicy = &policy
	}
	if cmd.PreUID != "" || cmd.PreRV != "" {
		options.Preconditions = &metav1.Preconditions{}
		if cmd.PreUID != "" {
			uid := types.UID(cmd.PreUID)
			options.Preconditions.UID = &uid
		}
		if cmd.PreRV != "" {
			options.Preconditions.ResourceVersion = &cmd.PreRV
		}
	}
	return options
}

// publish starts the kubelet plugin helper on first use (NodeName set, NodeUID left empty, so
// its ResourceSlice controller reads the Node) and hands it the pools.
func (d *driverState) publish(ctx context.Context, pools map[string][]resourceapi.Device) error {
	if err := d.startHelper(ctx); err != nil {
		return err
	}
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{}}
	for name, devices := range pools {
		resources.Pools[name] = resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: devices}}}
	}
	return d.helper.PublishResources(ctx, resources)
}

func (d *driverState) startHelper(_ context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.helper != nil {
		return nil
	}
	if d.pluginDir == "" {
		return errors.New("--plugin-dir is required to start the kubelet plugin helper")
	}
	registrar := filepath.Join(d.pluginDir, "registry")
	data := filepath.Join(d.pluginDir, "plugin")
	for _, dir := range []string{registrar, data} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	helper, err := kubeletplugin.Start(d.ctx, &plugin{d: d},
		kubeletplugin.KubeClient(d.client),
		kubeletplugin.DriverName(d.driver),
		kubeletplugin.NodeName(d.node),
		kubeletplugin.RegistrarDirectoryPath(registrar),
		kubeletplugin.PluginDataDirectoryPath(data),
	)
	if err != nil {
		return err
	}
	d.helper = helper
	return nil
}

// prepare calls the helper's DRA gRPC service as the kubelet does: the helper then reads
// each claim through draclient, through whatever connection the driver was given.
func (d *driverState) prepare(ctx context.Context, claims []claimRef) (map[string]any, error) {
	if err := d.startHelper(ctx); err != nil {
		return nil, err
	}
	socket := filepath.Join(d.pluginDir, "plugin", "dra.sock")
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	request := &drapb.NodePrepareResourcesRequest{}
	for _, c := range claims {
		request.Claims = append(request.Claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: c.UID})
	}
	response, err := drapb.NewDRAPluginClient(conn).NodePrepareResources(ctx, request)
	if err != nil {
		return nil, err
	}
	results := map[string]any{}
	for uid, claim := range response.Claims {
		devices := []string{}
		for _, device := range claim.Devices {
			devices = append(devices, device.PoolName+"/"+device.DeviceName)
		}
		results[uid] = map[string]any{"error": claim.Error, "devices": devices}
	}
	return map[string]any{"claims": results}, nil
}

// updateStatus is a typed read-modify-write of status.devices: the driver's own entries are
// replaced by the given ones, every other entry is kept as read.
func (d *driverState) updateStatus(ctx context.Context, cmd command) (map[string]any, error) {
	claims := d.client.ResourceV1().ResourceClaims(cmd.Namespace)
	claim, err := claims.Get(ctx, cmd.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	kept := []resourceapi.AllocatedDeviceStatus{}
	if !cmd.AllDevices {
		for _, entry := range claim.Status.Devices {
			if entry.Driver != d.driver {
				kept = append(kept, entry)
			}
		}
	}
	claim.Status.Devices = append(kept, cmd.Devices...)
	if cmd.Unconditional {
		claim.ResourceVersion = ""
	}
	updated, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	return objectResult(updated, err)
}

// watch starts informers as drivers run them (WatchList as client-go defaults it): the
// driver's own slices, pinned by field selector, and claims across all namespaces.
func (d *driverState) watch(kinds []string) error {
	for _, kind := range kinds {
		var tweak informers.SharedInformerOption
		switch kind {
		case "slices":
			selector := d.sliceSelector()
			tweak = informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = selector })
		case "claims":
			tweak = informers.WithTweakListOptions(func(*metav1.ListOptions) {})
		default:
			return fmt.Errorf("unknown informer kind %q", kind)
		}
		factory := informers.NewSharedInformerFactoryWithOptions(d.client, 0, tweak)
		var informer cache.SharedIndexInformer
		if kind == "slices" {
			informer = factory.Resource().V1().ResourceSlices().Informer()
		} else {
			informer = factory.Resource().V1().ResourceClaims().Informer()
		}
		emit := func(event string, obj any) {
			if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tombstone.Obj
			}
			meta, err := metaOf(obj)
			if err != nil {
				return
			}
			d.out.emit(map[string]any{
				"event": "informer", "kind": kind, "type": event,
				"namespace": meta.GetNamespace(), "name": meta.GetName(),
				"resourceVersion": meta.GetResourceVersion(),
			})
		}
		_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { emit("add", obj) },
			UpdateFunc: func(_, obj any) { emit("update", obj) },
			DeleteFunc: func(obj any) { emit("delete", obj) },
		})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithCancel(d.ctx)
		d.mu.Lock()
		d.informers = append(d.informers, cancel)
		d.mu.Unlock()
		factory.Start(ctx.Done())
		go func(kind string) {
			if cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
				d.out.emit(map[string]any{"event": "synced", "kind": kind})
			}
		}(kind)
	}
	return nil
}

func metaOf(obj any) (metav1.Object, error) {
	meta, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("not an object: %T", obj)
	}
	return meta, nil
}

func objectResult(obj any, err error) (map[string]any, error) {
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var object map[string]any
	if err := json.Unmarshal(raw, &object); err != nil {
		return nil, err
	}
	return map[string]any{"object": object}, nil
}

// plugin is the driver's side of the helper: it prepares whatever it is asked to, and
// reports the helper's background errors (a refused ResourceSlice write, say) on stdout.
type plugin struct{ d *driverState }

func (p *plugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		var devices []kubeletplugin.Device
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver == p.d.driver {
				devices = append(devices, kubeletplugin.Device{
					Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
				})
			}
		}
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return result, nil
}

func (p *plugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := map[types.UID]error{}
	for _, claim := range claims {
		result[claim.UID] = nil
	}
	return result, nil
}

func (p *plugin) HandleError(_ context.Context, err error, msg string) {
	event := map[string]any{"event": "helper-error", "error": err.Error(), "msg": msg}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		event["code"] = status.Status().Code
	}
	p.d.out.emit(event)
}
