"""Scale-out on Ray Serve: Playhead replicas behind Ray's HTTP proxy, routed by playback
slack. Needs the `cluster` extra (ray[serve]); app/cluster/config.py imports no Ray.

- replica.py: the deployment (each replica one Engine, itself the HTTP ingress);
- router.py: SlackRouter, Ray Serve's RequestRouter API over scheduling/routing.py;
- stats.py: the routing stats each replica reports;
- launch.py: `playhead serve --replicas N`.
"""
