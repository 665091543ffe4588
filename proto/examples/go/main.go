// A Go client of the engine, from the .proto alone: start a workflow, watch it to its end and
// read its state. Generate the code, then build (docs/api.md, "Clients in other stacks"):
//
//	protoc -Iproto --go_out=$GOPATH/src --go-grpc_out=$GOPATH/src \
//	  --go_opt=Mworkflow_engine/v1/workflow_engine.proto=example.com/workflowengine/v1 \
//	  --go-grpc_opt=Mworkflow_engine/v1/workflow_engine.proto=example.com/workflowengine/v1 \
//	  proto/workflow_engine/v1/workflow_engine.proto
//	go run ./proto/examples/go localhost:50051
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	wf "example.com/workflowengine/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

func newUUID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		log.Fatal(err)
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func main() {
	address := "localhost:50051"
	if len(os.Args) > 1 {
		address = os.Args[1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Plaintext, as `make run` serves; with TLS, grpc.WithTransportCredentials(credentials.
	// NewClientTLSFromFile(caFile, "")), and a token as "authorization: Bearer ..." metadata.
	// (Debian's grpc-go 1.33 predates credentials/insecure, hence WithInsecure.)
	conn, err := grpc.DialContext(ctx, address, grpc.WithInsecure())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := wf.NewWorkflowEngineClient(conn)

	// google.protobuf.Value and Struct have helpers in structpb: NewValue, NewStruct, AsMap.
	three, _ := structpb.NewValue(3)
	taskID := newUUID()
	started, err := client.StartWorkflow(ctx, &wf.StartWorkflowRequest{
		TaskId: taskID,
		Task: &wf.TaskSpec{
			Prompt: "Count to three and report as JSON",
			Steps: []*wf.Step{{
				Id:      "count",
				Command: []string{"sh", "-c", `echo '{"count": 3}'`},
				Expect:  []*wf.Check{{Kind: "json_field_equals", Field: "count", Equals: three}},
			}},
		},
	})
	if err != nil {
		log.Fatal(err) // e.g. InvalidArgument, naming the field
	}
	fmt.Printf("started %s: %s, workflow %s\n", taskID, started.Status, started.WorkflowStatus)

	events, err := client.WatchWorkflow(ctx, &wf.WatchWorkflowRequest{TaskId: taskID})
	if err != nil {
		log.Fatal(err)
	}
	for {
		event, err := events.Recv()
		if err == io.EOF { // the stream ends with the workflow
			break
		} else if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("#%d %s %s %s\n", event.Sequence, event.Kind, event.NodeId, event.Detail)
	}

	workflow, err := client.GetWorkflow(ctx, &wf.GetWorkflowRequest{TaskId: taskID})
	if err != nil {
		log.Fatal(err)
	}
	state := workflow.State.AsMap() // the Struct as plain Go maps
	result := state["steps"].(map[string]any)["count"].(map[string]any)["result"].(map[string]any)
	out, _ := json.Marshal(map[string]any{"status": workflow.Status.String(), "stdout": result["stdout"]})
	fmt.Println(string(out))
	if workflow.Status != wf.WorkflowStatus_SUCCEEDED {
		os.Exit(1)
	}
}
