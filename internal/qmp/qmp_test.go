package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"testing"
	"time"
)

// fakeQEMU answers QMP over one end of a pipe as QEMU does: a greeting, then replies carrying
// the command's id, interleaved with events. (The VM tier runs the real QEMU.)
func fakeQEMU(t *testing.T, conn net.Conn) {
	t.Helper()
	go func() {
		w := json.NewEncoder(conn)
		_ = w.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{}, "capabilities": []string{}}})
		r := bufio.NewScanner(conn)
		for r.Scan() {
			var req struct {
				Execute   string         `json:"execute"`
				ID        string         `json:"id"`
				Arguments map[string]any `json:"arguments"`
			}
			if err := json.Unmarshal(r.Bytes(), &req); err != nil {
				return
			}
			// An event first: the client must not take it for the reply.
			_ = w.Encode(map[string]any{"event": "COLO_EXIT", "data": map[string]any{"mode": "secondary", "reason": "request"},
				"timestamp": map[string]any{"seconds": 1, "microseconds": 2}})
			switch req.Execute {
			case "qmp_capabilities":
				_ = w.Encode(map[string]any{"id": req.ID, "return": map[string]any{}})
			case "query-colo-status":
				_ = w.Encode(map[string]any{"id": req.ID, "return": map[string]any{"mode": "primary", "last-mode": "none", "reason": "none"}})
			case "human-monitor-command":
				_ = w.Encode(map[string]any{"id": req.ID, "return": "ran " + req.Arguments["command-line"].(string) + "\r\n"})
			case "quit":
				_ = conn.Close()
				return
			default:
				_ = w.Encode(map[string]any{"id": req.ID, "error": map[string]any{"class": "CommandNotFound", "desc": "The command " + req.Execute + " has not been found"}})
			}
		}
	}()
}

func TestCommandsRepliesAndEvents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, server := net.Pipe()
	fakeQEMU(t, server)
	c, err := New(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Mode string `json:"mode"`
	}
	if err := c.Execute(ctx, "query-colo-status", nil, &st); err != nil || st.Mode != "primary" {
		t.Fatalf("query-colo-status: %+v %v", st, err)
	}
	out, err := c.HMP(ctx, "drive_add -n buddy driver=replication")
	if err != nil || out != "ran drive_add -n buddy driver=replication\r\n" {
		t.Fatalf("HMP: %q %v", out, err)
	}
	var qerr *Error
	if err := c.Execute(ctx, "x-no-such", nil, nil); !errors.As(err, &qerr) || qerr.Class != "CommandNotFound" || qerr.Command != "x-no-such" {
		t.Fatalf("an unknown command: %v", err)
	}
	ev := <-c.Events()
	if ev.Name != "COLO_EXIT" || ev.Timestamp.Microseconds != 2 {
		t.Fatalf("event %+v", ev)
	}
	// QEMU exits: pending and later commands fail with ErrClosed, and Done is closed.
	if err := c.Execute(ctx, "quit", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("a command QEMU did not answer before exiting: %v", err)
	}
	<-c.Done()
	if err := c.Execute(ctx, "query-status", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("a command after QEMU exited: %v", err)
	}
}

func TestNotQMP(t *testing.T) {
	client, server := net.Pipe()
	go func() { _, _ = server.Write([]byte("SSH-2.0-OpenSSH\n")); _ = server.Close() }()
	if _, err := New(context.Background(), client); err == nil {
		t.Fatal("a peer that is not QEMU was accepted")
	}
}

func TestDialWhenUpWaitsForTheSocketAndGivesUpWhenQEMUExits(t *testing.T) {
	sock := t.TempDir() + "/qmp.sock"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		time.Sleep(200 * time.Millisecond) // QEMU creates its socket a while after it starts
		ln, err := net.Listen("unix", sock)
		if err != nil {
			return
		}
		t.Cleanup(func() { _ = ln.Close() })
		if c, err := ln.Accept(); err == nil {
			fakeQEMU(t, c)
		}
	}()
	q, err := DialWhenUp(ctx, sock, nil)
	if err != nil {
		t.Fatalf("the socket appeared after 200ms: %v", err)
	}
	_ = q.Close()

	exited := make(chan struct{})
	close(exited)
	if _, err := DialWhenUp(ctx, t.TempDir()+"/none.sock", exited); err == nil || ctx.Err() != nil {
		t.Fatalf("QEMU had exited: err %v, want an error at once", err)
	}
}
