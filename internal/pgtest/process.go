package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// What the servers of this package (postgres, PgBouncer) share: the user
// they run as, how they are started and stopped, and the wait for their
// first connection.

// serverCredential is the credential the servers run with: none, except as
// root, which PostgreSQL and PgBouncer refuse: then the postgres user's.
// who names the server for the error when there is no such user.
func serverCredential(who string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root, and %s refuses root, but there is no postgres user to run it as: %w", who, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// chown gives dirs to cred's user; without cred it does nothing.
func chown(cred *syscall.Credential, dirs ...string) error {
	if cred == nil {
		return nil
	}
	for _, d := range dirs {
		if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
	}
	return nil
}

// startServer starts cmd as cred and returns a channel that is closed once
// it has exited. Pdeathsig (SIGKILL) is tied to the OS thread that forks,
// so the fork happens on a locked thread that stays alive for as long as
// the server does: a test binary that dies takes its servers with it.
func startServer(cmd *exec.Cmd, cred *syscall.Credential) (<-chan struct{}, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(exited)
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}

// stopServer sends sig to a server started by startServer and waits for it
// to exit; after grace it kills it.
func stopServer(cmd *exec.Cmd, exited <-chan struct{}, sig os.Signal, grace time.Duration) {
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// errExited is awaitConnections' error for a server that exited first.
var errExited = errors.New("pgtest: the server exited at start-up")

// awaitConnections returns nil once url accepts a connection. It returns
// errExited if the server exits first, ctx's error if ctx ends, and after
// within the last connection error.
func awaitConnections(ctx context.Context, url string, exited <-chan struct{}, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		select {
		case <-exited:
			return errExited
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}
