package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPgBouncer is returned by StartPgBouncer when the pgbouncer binary is
// missing.
var ErrNoPgBouncer = errors.New("pgtest: no pgbouncer binary on PATH or in /usr/sbin; install it (Debian: apt-get install pgbouncer)")

// PgBouncer is a throwaway PgBouncer in transaction pooling mode in front of
// a PostgreSQL server, on a free loopback port.
type PgBouncer struct {
	dir    string
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartPgBouncer starts PgBouncer in transaction pooling mode in front of the
// server that serverURL points at (any database name is passed through),
// trusting the user of serverURL. As root it runs as the postgres user,
// since PgBouncer refuses root.
func StartPgBouncer(ctx context.Context, serverURL string) (*PgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, statErr := os.Stat("/usr/sbin/pgbouncer"); statErr != nil {
			return nil, ErrNoPgBouncer
		}
		bin = "/usr/sbin/pgbouncer"
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("pgtest: pgbouncer: %w", err)
	}
	dir, err := os.MkdirTemp("", "standmeet-events-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	b := &PgBouncer{dir: dir, exited: make(chan struct{})}
	if b.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	userName := u.User.Username()
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 40
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile =
`, u.Hostname(), u.Port(), b.port, filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.log"))
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(strconv.Quote(userName)+` ""`+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		pu, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgtest: pgbouncer refuses root, and there is no postgres user to run it as: %w", err)
		}
		uid, _ := strconv.Atoi(pu.Uid)
		gid, _ := strconv.Atoi(pu.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	b.cmd = exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // Pdeathsig follows the forking thread
		defer runtime.UnlockOSThread()
		if err := b.cmd.Start(); err != nil {
			started <- err
			close(b.exited)
			return
		}
		started <- nil
		_ = b.cmd.Wait()
		close(b.exited)
	}()
	if err := <-started; err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: starting pgbouncer: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, b.URL(serverURL))
		if err == nil {
			conn.Close(ctx)
			return b, nil
		}
		select {
		case <-b.exited:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: pgbouncer exited at start-up: %s", strings.TrimSpace(string(log)))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Close()
			return nil, fmt.Errorf("pgtest: pgbouncer did not accept connections within 30s: %w", err)
		}
	}
}

// URL returns serverURL with its host and port replaced by PgBouncer's.
func (b *PgBouncer) URL(serverURL string) string {
	u, err := url.Parse(serverURL)
	if err != nil {
		return serverURL
	}
	u.Host = fmt.Sprintf("127.0.0.1:%d", b.port)
	return u.String()
}

// Close stops PgBouncer and removes its files.
func (b *PgBouncer) Close() {
	if b.cmd != nil && b.cmd.Process != nil {
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.exited:
		case <-time.After(5 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.exited
		}
	}
	os.RemoveAll(b.dir)
}
