package virtlauncher

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lockstep-dev/lockstep/internal/kubevirthook/api/info"
	"github.com/lockstep-dev/lockstep/internal/kubevirthook/api/v1alpha3"
)

// Hook is a VMI's hook sidecar: the lockstep-kubevirt-hook process, serving on its socket as in
// the sidecar container of a virt-launcher pod.
type Hook struct {
	Sock string
	cmd  *exec.Cmd
	logf *os.File
}

// StartHook runs the hook binary bin on a socket in dir; runDir is the members' directory
// (--run-dir), log the file its output goes to.
func StartHook(bin, dir, runDir, log string) (*Hook, error) {
	logf, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	h := &Hook{Sock: filepath.Join(dir, "lockstep.sock"), logf: logf}
	h.cmd = exec.Command(bin, "--sidecar-socket", h.Sock, "--run-dir", runDir)
	h.cmd.Stdout, h.cmd.Stderr = logf, logf
	if err := h.cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, err
	}
	return h, nil
}

// Stop ends the sidecar.
func (h *Hook) Stop() {
	if h.cmd.Process != nil {
		_ = h.cmd.Process.Kill()
		_ = h.cmd.Wait()
	}
	_ = h.logf.Close()
}

// OnDefineDomain is virt-launcher's side of the hook: the Info handshake (the hook's name, hook
// points and versions), then the domain and the VMI (JSON) through OnDefineDomain.
func (h *Hook) OnDefineDomain(ctx context.Context, domainXML, vmiJSON []byte) ([]byte, error) {
	conn, err := grpc.NewClient("unix://"+h.Sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	var res *info.InfoResult
	for {
		if res, err = info.NewInfoClient(conn).Info(ctx, &info.InfoParams{}); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the hook's Info: %w (%s)", err, Tail(h.logf.Name()))
		case <-time.After(50 * time.Millisecond):
		}
	}
	if len(res.HookPoints) != 1 || res.HookPoints[0].Name != "OnDefineDomain" || len(res.Versions) == 0 || res.Versions[0] != "v1alpha3" {
		return nil, fmt.Errorf("the hook's handshake: %v", res)
	}
	out, err := v1alpha3.NewCallbacksClient(conn).OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: domainXML, Vmi: vmiJSON})
	if err != nil {
		return nil, fmt.Errorf("OnDefineDomain: %w", err)
	}
	return out.DomainXML, nil
}
