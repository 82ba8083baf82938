package main

// The calls real drivers make from the node beyond slices and claims (issue 27): labels on
// their own Node and Pod (NVIDIA), an Event from client-go's recorder, leader election's Lease,
// DeviceTaintRules (Intel Gaudi), a status write of their own custom resource (NVIDIA's
// ComputeDomains), and the Pods on their node (TPU plugins). Each goes through the same
// client the driver was configured with, with client-go's defaults (protobuf for built-in
// kinds, JSON for custom resources and patches).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
)

// dispatchExtra runs the ops of this file; handled is false for an op it does not know.
func (d *driverState) dispatchExtra(ctx context.Context, cmd command) (result map[string]any, handled bool, err error) {
	handled = true
	switch cmd.Op {
	case "patch-node-labels":
		// A strategic-merge patch, as `kubectl label` sends it.
		result, err = d.patchLabels(ctx, cmd, types.StrategicMergePatchType)
	case "patch-pod-labels":
		// A JSON merge patch of the driver's own Pod (its name from the downward API).
		result, err = d.patchLabels(ctx, cmd, types.MergePatchType)
	case "record-event":
		result, err = d.recordEvent(ctx, cmd)
	case "lead":
		result, err = d.lead(ctx, cmd)
	case "create-taint-rule":
		var rule resourcev1beta2.DeviceTaintRule
		if err = json.Unmarshal(cmd.Object, &rule); err != nil {
			return nil, true, fmt.Errorf("object: %w", err)
		}
		created, createErr := d.client.ResourceV1beta2().DeviceTaintRules().Create(ctx, &rule, metav1.CreateOptions{})
		result, err = objectResult(created, createErr)
	case "update-custom-status":
		result, err = d.updateCustomStatus(ctx, cmd)
	case "list-pods":
		list, listErr := d.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: cmd.FieldSelector})
		if listErr != nil {
			return nil, true, listErr
		}
		pods := []map[string]string{}
		for _, pod := range list.Items {
			pods = append(pods, map[string]string{
				"namespace": pod.Namespace, "name": pod.Name, "nodeName": pod.Spec.NodeName,
			})
		}
		result = map[string]any{"pods": pods}
	default:
		handled = false
	}
	return result, handled, err
}

// patchLabels patches metadata.labels of this node (patch-node-labels) or of the pod
// cmd.Namespace/cmd.Name; a null value removes a label.
func (d *driverState) patchLabels(ctx context.Context, cmd command, patchType types.PatchType) (map[string]any, error) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": cmd.Labels}})
	if err != nil {
		return nil, err
	}
	if cmd.Op == "patch-node-labels" {
		node, err := d.client.CoreV1().Nodes().Patch(ctx, d.node, patchType, patch, metav1.PatchOptions{})
		return objectResult(node, err)
	}
	pod, err := d.client.CoreV1().Pods(cmd.Namespace).Patch(ctx, cmd.Name, patchType, patch, metav1.PatchOptions{})
	return objectResult(pod, err)
}

// sinkResult is what the recorder's sink got back for one write.
type sinkResult struct {
	verb  string
	event *corev1.Event
	err   error
}

// reportingSink is the recorder's own sink (record.EventSinkImpl on the typed client), telling
// the command what each write got back: the recorder writes in the background.
type reportingSink struct {
	sink    record.EventSink
	results chan sinkResult
}

func (s *reportingSink) Create(event *corev1.Event) (*corev1.Event, error) {
	created, err := s.sink.Create(event)
	s.results <- sinkResult{"create", created, err}
	return created, err
}

func (s *reportingSink) Update(event *corev1.Event) (*corev1.Event, error) {
	updated, err := s.sink.Update(event)
	s.results <- sinkResult{"update", updated, err}
	return updated, err
}

func (s *reportingSink) Patch(old *corev1.Event, data []byte) (*corev1.Event, error) {
	patched, err := s.sink.Patch(old, data)
	s.results <- sinkResult{"patch", patched, err}
	return patched, err
}

// recordEvent emits one Event about the Pod cmd.Namespace/cmd.Name with client-go's classic
// recorder (tools/record: core/v1 Events, what leader election's and most drivers' recorders
// are), reporting as the driver (or cmd.Component) from this node, and answers with what its
// sink got back.
func (d *driverState) recordEvent(ctx context.Context, cmd command) (map[string]any, error) {
	sink := &reportingSink{
		sink:    &typedcorev1.EventSinkImpl{Interface: d.client.CoreV1().Events("")},
		results: make(chan sinkResult, 16),
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	watcher := broadcaster.StartRecordingToSink(sink)
	defer watcher.Stop()
	component := d.driver
	if cmd.Component != "" {
		component = cmd.Component
	}
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component, Host: d.node})
	pod := &corev1.ObjectReference{
		APIVersion: "v1", Kind: "Pod", Namespace: cmd.Namespace, Name: cmd.Name, UID: types.UID(cmd.UID),
	}
	recorder.Event(pod, corev1.EventTypeNormal, cmd.Reason, cmd.Message)
	select {
	case got := <-sink.results:
		if got.err != nil {
			return nil, got.err
		}
		result, err := objectResult(got.event, nil)
		if result != nil {
			result["verb"] = got.verb
		}
		return result, err
	case <-ctx.Done():
		return nil, errors.New("the recorder wrote nothing before the command's deadline")
	}
}

// lead runs leader election on the Lease cmd.Namespace/cmd.Name as controllers do (get,
// create, renew), and gives the lease up as soon as it leads (ReleaseOnCancel: get, update).
func (d *driverState) lead(ctx context.Context, cmd command) (map[string]any, error) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: cmd.Namespace, Name: cmd.Name},
		Client:     d.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: d.driver + "/" + d.node},
	}
	electionCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var led atomic.Bool
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Name:            cmd.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { led.Store(true); cancel() },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return nil, err
	}
	elector.Run(electionCtx) // returns once released (or when the command's deadline passes)
	if !led.Load() {
		return nil, errors.New("did not become leader before the command's deadline")
	}
	return map[string]any{"led": true, "identity": lock.Identity()}, nil
}

// updateCustomStatus reads a custom resource (cmd.Resource: resource.version.group) and writes
// its status with cmd.Status, read-modify-write as a controller's typed client does (JSON).
func (d *driverState) updateCustomStatus(ctx context.Context, cmd command) (map[string]any, error) {
	gvr, _ := schema.ParseResourceArg(cmd.Resource)
	if gvr == nil {
		return nil, fmt.Errorf("resource %q is not resource.version.group", cmd.Resource)
	}
	objects := d.dynamic.Resource(*gvr).Namespace(cmd.Namespace)
	object, err := objects.Get(ctx, cmd.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var status map[string]any
	if err := json.Unmarshal(cmd.Status, &status); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	if err := unstructured.SetNestedMap(object.Object, status, "status"); err != nil {
		return nil, err
	}
	updated, err := objects.UpdateStatus(ctx, object, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	return map[string]any{"object": updated.Object}, nil
}
